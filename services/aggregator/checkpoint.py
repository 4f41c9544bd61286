"""Checkpoints after every round: the global model (npz, never pickle) plus a JSON manifest.

Every byte of a checkpoint is covered by a checksum: the manifest holds the model's SHA-256
(``model_sha256``) and the SHA-256 of a canonical serialisation of its own content (``sha256``:
format, round, model name and hash, the run state). The round journal is appended to
``journal.jsonl`` beside it (``journal_file``), the state holding a constant-size reference to
the hash-chained prefix it commits to: a checkpoint costs the same at round 10,000 as at 10.
Writes are durable and atomic (fsync; temporary file, ``os.replace``, directory fsync), the
journal first and the manifest last: its rename commits the round, so a crash (SIGKILL)
anywhere in ``save`` leaves the previous checkpoint loadable (``test_crash_recovery.py`` kills
the aggregator there); what it leaves half-done (a model without a manifest, a ``*.tmp``,
journal lines past the prefix) the next save or start removes. A disk refusing a write
(``save_or_report``) costs a warning, not the run.

At load a checkpoint is *rejected* — one warning naming the file and the reason, one increment of
``powertrip_checkpoint_rejected_total{reason}`` — when its manifest is unreadable, not JSON, not
an object of the expected shape (keys and types), written before manifests checksummed
themselves (``old-format``: start fresh with ``POWERTRIP_START_FRESH=1``), when a checksum or
its journal prefix does not verify, when the npz does not load with ``allow_pickle=False``, or
when the caller's ``validate`` refuses it: a state field of the wrong type (TypeError:
``malformed``), arrays or a journal that do not fit the run (``incompatible``). Format 2
manifests (the journal inside) still load; the next save moves the journal to the file. The
next older one is then tried. A directory with checkpoints none of which loads raises
``NoUsableCheckpoint`` (the aggregator refuses to start) unless ``start_fresh``; an empty one is
a first start. Once another starting point is chosen, rejected checkpoints are renamed
``*.rejected``: kept for the operator, never tried again nor pruned in place of good ones.
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

from powertrip.services.aggregator import journal_file, metrics
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
from powertrip.services.aggregator.journal_file import JournalError, JournalFile, JournalRef
from powertrip.services.common.fault_points import fault_point

logger = logging.getLogger(__name__)
KEEP = 2  # the newest and one fallback
#: npz entries under this prefix are the outer optimizer's momentum (``powertrip.outer_step``),
#: not model arrays: in the same file, so the model's SHA-256 covers them too
MOMENTUM = "__outer_momentum__."
_MODEL = re.compile(r"round-(\d{6,})\.npz")


class NoUsableCheckpoint(RuntimeError):
    """Checkpoints exist but none of them verifies: resuming is impossible, starting over is
    the operator's decision (``POWERTRIP_START_FRESH=1``)."""


@dataclass(frozen=True)
class Checkpoint:
    round: int
    params: dict[str, NDArray]
    state: dict[str, Any]  # clock, accuracy, journal (its entries, read from the file)...
    journal: JournalRef | None = None  # the journal prefix it commits to (None: format 2)
    momentum: dict[str, NDArray] | None = None  # the outer step's (None: FedAvg, or none yet)


def _split(arrays: dict[str, NDArray]) -> tuple[dict[str, NDArray], dict[str, NDArray] | None]:
    """A checkpoint's npz entries as (model, outer momentum or None)."""
    model = {k: v for k, v in arrays.items() if not k.startswith(MOMENTUM)}
    momentum = {k[len(MOMENTUM) :]: v for k, v in arrays.items() if k.startswith(MOMENTUM)}
    return model, momentum or None


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
    """Commit round ``round_index``: the journal's staged entries appended and fsynced (its
    reference goes in ``state``), then the model and its manifest, each written to a temporary
    file, fsynced and renamed into place; the manifest's rename is the commit. A crash at any
    point leaves the previous round loadable and at worst files the next save overwrites or
    prunes or the next start deletes. OSError (disk full, fsync failing) leaves the same.
    ``momentum`` (the outer step's state) goes into the model's npz under ``MOMENTUM``."""
    if any(k.startswith(MOMENTUM) for k in params):
        raise ValueError(f"a model array name starts with the reserved {MOMENTUM!r}")
    arrays = {**params, **{MOMENTUM + k: v for k, v in (momentum or {}).items()}}
    directory.mkdir(parents=True, exist_ok=True)
    if journal is not None:
        state = {**state, "journal": journal.sync().to_json()}
    model = directory / f"round-{round_index:06d}.npz"
    commit_rename(write_temp(model, lambda f: np.savez(f, **arrays)), model)
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


def save_or_report(
    directory: Path,
    round_index: int,
    params: Mapping[str, NDArray],
    state: dict,
    journal: JournalFile | None = None,
    momentum: Mapping[str, NDArray] | None = None,
) -> bool:
    """``save``; when the disk refuses it (OSError: full, read-only, fsync failing), one
    warning and one count of ``powertrip_checkpoint_write_failures_total``, and False: the run
    goes on (a checkpoint is a restart point, not a result: refusing to train would turn a full
    disk into a crash loop), and a restart resumes from the last round that was written."""
    try:
        save(directory, round_index, params, state, journal, momentum)
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
    params, momentum = _split(arrays)
    state, ref = manifest["state"], None
    if manifest["format"] != 2 and "journal" in state:  # format 2: the journal is inside
        try:
            state, ref = journal_file.resolve(manifest_path.parent, state)
        except JournalError as exc:
            culprit = exc.path or manifest_path
            raise Rejected(exc.reason, culprit, f"{exc} (for {manifest_path.name})") from None
    ckpt = Checkpoint(manifest["round"], params, state, ref, momentum)
    if validate is not None:
        try:
            validate(ckpt)
        except TypeError as exc:  # a field of the wrong type: not what a writer of ours writes
            raise Rejected("malformed", manifest_path, str(exc) or repr(exc)) from None
        except (ValueError, KeyError, IndexError, AttributeError) as exc:
            raise Rejected("incompatible", manifest_path, str(exc) or repr(exc)) from None
    return ckpt


def _try(manifest_path: Path, validate: Callable[[Checkpoint], None] | None) -> Checkpoint | None:
    """``_load`` with a rejection logged (one line) and counted."""
    try:
        return _load(manifest_path, validate)
    except Rejected as r:
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
    rejected = []
    found = None
    if directory.is_dir():
        remove_leftovers(directory)
    for manifest_path in sorted(directory.glob("round-*.json"), reverse=True):
        found = _try(manifest_path, validate)
        if found is not None:
            break
        rejected.append(manifest_path)
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
