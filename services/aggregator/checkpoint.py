"""Checkpoints after every round: the global model and every run state a resume needs (npz,
never pickle) plus a JSON manifest.

A checkpoint stands on its own: its state names the run it belongs to (``run``: a digest of the
configuration and seed) and holds each component's ``state_dict()`` (the policy, the round
loop, the robust rule, ...; ``run.checkpoint_state`` assembles them), the numbers in the
manifest and the numpy arrays in the npz beside the model (``pack``/``unpack``). A resume loads
them and replays nothing: the round journal beside the checkpoints (``journal_file``) is the
run's history only, and its damage never rejects a checkpoint (R34).

Every byte of a checkpoint is covered by a checksum: the manifest holds the model's SHA-256
(``model_sha256``; the npz holds the state's arrays too) and the SHA-256 of a canonical
serialisation of its own content (``sha256``: format, round, model name and hash, the run
state). Writes are durable and atomic (fsync; temporary file, ``os.replace``, directory fsync),
the journal's append first (a disk refusing it costs a warning, not the checkpoint) and the
manifest last: its rename commits the round, so a crash (SIGKILL) anywhere in ``save`` leaves
the previous checkpoint loadable (``test_crash_recovery.py`` kills the aggregator there); what
it leaves half-done (a model without a manifest, a ``*.tmp``, journal lines past the round) the
next save or start removes. A disk refusing a write (``save_or_report``) costs a warning, not
the run.

At load a checkpoint is *rejected* — one warning naming the file and the reason, one increment of
``powertrip_checkpoint_rejected_total{reason}`` — when its manifest is unreadable, not JSON, not
an object of the expected shape (keys and types), written by an older version (``old-format``:
no self-checksum, or a format 2/3 checkpoint, resumed by replaying a journal; start fresh with
``POWERTRIP_START_FRESH=1``), when a checksum does not verify, when the npz does not load with
``allow_pickle=False``, or when the caller's ``validate`` refuses it: a state field of the wrong
type (TypeError: ``malformed``), arrays or states that do not fit the run (``incompatible``), a
checkpoint of another run (``OtherRun``: ``other-run``). The next older one is then tried. A
directory with checkpoints none of which loads raises ``NoUsableCheckpoint`` (the aggregator
refuses to start, in one line) unless ``start_fresh``; an empty one is a first start. Once
another starting point is chosen, rejected checkpoints are renamed ``*.rejected``: kept for the
operator, never tried again nor pruned in place of good ones.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from powertrip.services.aggregator import metrics
from powertrip.services.aggregator.checkpoint_verify import (
    FORMAT,
    Rejected,
    verified_manifest,
    verified_params,
)
from powertrip.services.aggregator.durable_files import (
    TMP,
    canonical_sha256,
    commit_rename,
    fsync_dir,
    sha256_file,
    write_temp,
)
from powertrip.services.aggregator.journal_file import JournalFile
from powertrip.services.common.fault_points import fault_point

logger = logging.getLogger(__name__)
KEEP = 2  # the newest and one fallback
#: npz entries under this prefix are the outer optimizer's momentum
# (``powertrip.aggregation.outer_step``),
#: not model arrays: in the same file, so the model's SHA-256 covers them too
MOMENTUM = "__outer_momentum__."
#: npz entries under this prefix are the arrays of the run's component states (``pack``)
STATE = "__state__."
#: how a state refers to one of its arrays in the manifest
ARRAY_REF = "__array__"
_MODEL = re.compile(r"round-(\d{6,})\.npz")


class OtherRun(ValueError):
    """A verified checkpoint written by a run of another configuration or seed."""


class NoUsableCheckpoint(RuntimeError):
    """Checkpoints exist but none of them verifies: resuming is impossible, starting over is
    the operator's decision (``POWERTRIP_START_FRESH=1``)."""


@dataclass(frozen=True)
class Checkpoint:
    round: int
    params: dict[str, NDArray]
    state: dict[str, Any]  # the run's identity, clock, components (their arrays in place)...
    momentum: dict[str, NDArray] | None = None  # the outer step's (None: FedAvg, or none yet)


def _split(
    arrays: dict[str, NDArray],
) -> tuple[dict[str, NDArray], dict[str, NDArray] | None, dict[str, NDArray]]:
    """A checkpoint's npz entries as (model, outer momentum or None, state arrays)."""
    model = {k: v for k, v in arrays.items() if not k.startswith((MOMENTUM, STATE))}
    momentum = {k[len(MOMENTUM) :]: v for k, v in arrays.items() if k.startswith(MOMENTUM)}
    state = {k[len(STATE) :]: v for k, v in arrays.items() if k.startswith(STATE)}
    return model, momentum or None, state


def pack(state: Any) -> tuple[Any, dict[str, NDArray]]:
    """A state of plain values and numpy arrays as (JSON-able state, arrays): each array is
    replaced by ``{ARRAY_REF: i}`` and stored as array ``str(i)``; tuples become lists (as JSON
    gives them back). TypeError for anything else (a state is never pickled)."""
    arrays: dict[str, NDArray] = {}

    def walk(value: Any, where: str) -> Any:
        if isinstance(value, np.ndarray):
            key = str(len(arrays))
            arrays[key] = value
            return {ARRAY_REF: int(key)}
        if isinstance(value, Mapping):
            if not all(isinstance(k, str) for k in value) or ARRAY_REF in value:
                raise TypeError(f"state {where} has a key that is not a plain string")
            return {k: walk(v, f"{where}.{k}") for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, np.generic):
            return value.item()
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise TypeError(f"state {where} is a {type(value).__name__}, not a plain value")

    return walk(state, "state"), arrays


def unpack(state: Any, arrays: Mapping[str, NDArray]) -> Any:
    """``pack``'s inverse; TypeError when a reference names no array or an array is unused."""
    used: set[str] = set()

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {ARRAY_REF}:
                key = str(value[ARRAY_REF])
                if type(value[ARRAY_REF]) is not int or key not in arrays:
                    raise TypeError(f"state refers to array {value[ARRAY_REF]!r}, not in the npz")
                used.add(key)
                return arrays[key]
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    out = walk(state)
    if set(arrays) - used:
        raise TypeError(f"the npz holds state arrays no state refers to: {sorted(set(arrays))}")
    return out


def _prune(directory: Path, newest: int) -> None:
    """Keep the ``KEEP`` newest rounds; delete the older ones, and any model file of a round
    up to ``newest`` that has no manifest (a crash between a model and its manifest, or in the
    middle of a previous prune), so crashes leave no garbage that accumulates."""
    manifests = sorted(directory.glob("round-*.json"))
    for old in manifests[:-KEEP]:
        old.unlink(missing_ok=True)
        old.with_suffix(".npz").unlink(missing_ok=True)
    kept = {m.with_suffix(".npz").name for m in manifests[-KEEP:]}
    for model in directory.glob("round-*.npz"):
        match = _MODEL.fullmatch(model.name)
        if model.name not in kept and match and int(match[1]) <= newest:
            model.unlink(missing_ok=True)


def save(
    directory: Path,
    round_index: int,
    params: Mapping[str, NDArray],
    state: dict,
    journal: JournalFile | None = None,
    momentum: Mapping[str, NDArray] | None = None,
) -> Path:
    """Commit round ``round_index``: the journal's staged entries appended and fsynced (history:
    a disk refusing it is reported, the checkpoint is still written), then the model and its
    manifest, each written to a temporary file, fsynced and renamed into place; the manifest's
    rename is the commit. A crash at any point leaves the previous round loadable and at worst
    files the next save overwrites or prunes or the next start deletes. OSError (disk full,
    fsync failing) leaves the same. ``state``'s numpy arrays (``pack``) go into the npz under
    ``STATE``, ``momentum`` (the outer step's state) under ``MOMENTUM``."""
    if any(k.startswith((MOMENTUM, STATE)) for k in params):
        raise ValueError(f"a model array name starts with a reserved {MOMENTUM!r} or {STATE!r}")
    state, state_arrays = pack(state)
    arrays = {
        **params,
        **{MOMENTUM + k: v for k, v in (momentum or {}).items()},
        **{STATE + k: v for k, v in state_arrays.items()},
    }
    directory.mkdir(parents=True, exist_ok=True)
    if journal is not None:
        journal.sync_or_report()
    model = directory / f"round-{round_index:06d}.npz"

    def save(f: Any) -> None:  # numpy's stub lets **arrays bind its allow_pickle (a bool) too
        np.savez(f, **arrays)  # type: ignore[arg-type]

    commit_rename(write_temp(model, save), model)
    body = {
        "format": FORMAT,
        "round": round_index,
        "model": model.name,
        "model_sha256": sha256_file(model),
        # through JSON once, so the hash covers exactly what a load will read back
        "state": json.loads(json.dumps(state)),
    }
    manifest = {**body, "sha256": canonical_sha256(body)}
    path = directory / f"round-{round_index:06d}.json"
    tmp = write_temp(path, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
    # the worst moment to die: the new model in place, its manifest written but not committed
    fault_point("checkpoint-write", round_index)
    commit_rename(tmp, path)
    fault_point("checkpoint-commit", round_index)  # committed, not yet durable nor pruned
    fsync_dir(directory)
    _prune(directory, round_index)
    return model


def save_or_report(round_index: int, save_round: Callable[[], object]) -> bool:
    """``save_round()`` (``save`` of round ``round_index``); when the disk refuses it (OSError:
    full, read-only, fsync failing), one warning and one count of
    ``powertrip_checkpoint_write_failures_total``, and False: the run goes on (a checkpoint is a
    restart point, not a result: refusing to train would turn a full disk into a crash loop),
    and a restart resumes from the last round that was written."""
    try:
        save_round()
    except OSError as exc:
        metrics.CHECKPOINT_WRITE_FAILURES.inc()
        logger.warning(
            "checkpoint of round %d not written, the run goes on: %s: %s",
            round_index,
            type(exc).__name__,
            " ".join(str(exc).split()),
        )
        return False
    return True


def remove_leftovers(directory: Path) -> list[Path]:
    """Delete the temporary files a crash during ``save`` left behind (at start: one writer
    per directory, so none is in use); the paths removed."""
    gone = sorted(directory.glob(f"round-*{TMP}"))
    for path in gone:
        path.unlink(missing_ok=True)
        logger.info("removed %s, left by a crash during a checkpoint write", path.name)
    return gone


def _load(manifest_path: Path, validate: Callable[[Checkpoint], None] | None) -> Checkpoint:
    """The checkpoint of ``manifest_path``, or ``Rejected`` naming the file at fault."""
    manifest = verified_manifest(manifest_path)
    arrays = verified_params(manifest_path.parent / manifest["model"], manifest["model_sha256"])
    params, momentum, state_arrays = _split(arrays)
    try:
        state = unpack(manifest["state"], state_arrays)
    except TypeError as exc:
        raise Rejected("malformed", manifest_path, str(exc)) from None
    ckpt = Checkpoint(manifest["round"], params, state, momentum)
    if validate is not None:
        try:
            validate(ckpt)
        except OtherRun as exc:
            raise Rejected("other-run", manifest_path, str(exc)) from None
        except TypeError as exc:  # a field of the wrong type: not what a writer of ours writes
            raise Rejected("malformed", manifest_path, str(exc) or repr(exc)) from None
        except (ValueError, KeyError, IndexError, AttributeError) as exc:
            raise Rejected("incompatible", manifest_path, str(exc) or repr(exc)) from None
    return ckpt


def _try(
    manifest_path: Path,
    validate: Callable[[Checkpoint], None] | None,
    reasons: set[str] | None = None,
) -> Checkpoint | None:
    """``_load`` with a rejection logged (one line) and counted (its reason added to
    ``reasons``)."""
    try:
        return _load(manifest_path, validate)
    except Rejected as r:
        if reasons is not None:
            reasons.add(r.reason)
        metrics.CHECKPOINT_REJECTED.labels(r.reason).inc()
        logger.warning("checkpoint rejected: %s: %s (%s)", r.path, r.reason, r.detail)
        return None


def _set_aside(manifest_path: Path) -> None:
    for path in (manifest_path, manifest_path.with_suffix(".npz")):
        if path.exists():
            os.replace(path, path.with_name(path.name + ".rejected"))


def load_latest(
    directory: Path,
    validate: Callable[[Checkpoint], None] | None = None,
    start_fresh: bool = False,
) -> Checkpoint | None:
    """The newest checkpoint that verifies and that ``validate`` accepts (it raises TypeError for
    a field of the wrong type, ValueError or KeyError for what does not fit the run); None when
    there is none at all (a first start) or, with ``start_fresh``, when none verifies.
    Checkpoints exist but none verifies, without ``start_fresh``: ``NoUsableCheckpoint``."""
    rejected: list[Path] = []
    reasons: set[str] = set()
    found = None
    if directory.is_dir():
        remove_leftovers(directory)
    for manifest_path in sorted(directory.glob("round-*.json"), reverse=True):
        found = _try(manifest_path, validate, reasons)
        if found is not None:
            break
        rejected.append(manifest_path)
    if rejected and found is None and not start_fresh and reasons == {"other-run"}:
        raise NoUsableCheckpoint(
            f"refusing to start: the checkpoints in {directory} belong to another run (another "
            "configuration or seed); point POWERTRIP_CHECKPOINT_DIR elsewhere, or set "
            "POWERTRIP_START_FRESH=1 to set them aside and start this run from round 0"
        )
    if rejected and found is None and not start_fresh:
        raise NoUsableCheckpoint(
            f"refusing to start: none of the {len(rejected)} checkpoints in {directory} "
            "verifies (each rejection is logged above); restore a good one, or set "
            "POWERTRIP_START_FRESH=1 to start the run over from round 0"
        )
    for path in rejected:
        _set_aside(path)
    if rejected and found is None:
        logger.warning("no checkpoint verifies: starting from round 0 (POWERTRIP_START_FRESH=1)")
    metrics.CHECKPOINT_LOADED_ROUND.set(0 if found is None else found.round)
    return found


def load_round(
    directory: Path, round_index: int, validate: Callable[[Checkpoint], None] | None = None
) -> Checkpoint | None:
    """One round's checkpoint if it is still kept and verifies (the fallback of the newest)."""
    path = directory / f"round-{round_index:06d}.json"
    return _try(path, validate) if path.exists() else None
