"""Saving and loading per-site local optimizer states (``SiteState``) as one file.

A process that keeps sites' optimizer states between rounds (a services worker) writes them
here after each round, so a restart resumes every site bit-identically instead of from zero
moments. The file is replaced atomically (temporary file, fsync, ``os.replace``, directory
fsync): a crash mid-write leaves the previous file whole. It records the run's identity, so a
state from another run is never resumed, and what is read back is bounded by the model: names,
shapes and moment kinds must match, steps must be non-negative; anything else is refused with
an error naming the file (a silently ignored corrupt file would change the run's result).

Tensors go through ``torch.save`` and come back through ``torch.load(weights_only=True)`` (no
pickled code runs), so every dtype round-trips bit for bit.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from powertrip.learning.device import to_host
from powertrip.learning.site_optim import SiteState

__all__ = [
    "FORMAT",
    "LoadedStates",
    "SiteStateFileError",
    "load_site_states",
    "run_identity",
    "save_site_states",
]

FORMAT = "powertrip-site-states/1"
#: the moment kinds a ``SiteOptimizer`` keeps (AdamW's two, momentum/nesterov's one)
KINDS = frozenset({"exp_avg", "exp_avg_sq", "momentum"})


class SiteStateFileError(ValueError):
    """A state file that cannot be trusted: unreadable, malformed, or not this model's."""


@dataclass(frozen=True)
class LoadedStates:
    """What a load found: the states to resume (empty when starting fresh), why it starts
    fresh when it does (a line to log; None otherwise), and the round they were saved after."""

    states: dict[int, SiteState]
    fresh_because: str | None = None
    round: int | None = None
    dropped: tuple[int, ...] = ()  # saved sites this process no longer hosts


def run_identity(run_config_json: str, run_seed: int) -> str:
    """A short digest naming one run: its configuration and seed."""
    digest = hashlib.sha256(f"{run_seed}\n{run_config_json}".encode()).hexdigest()
    return digest[:16]


def save_site_states(
    path: Path, states: Mapping[int, SiteState], identity: str, round_index: int
) -> None:
    """Write ``states`` (moments moved to the CPU) to ``path`` atomically."""
    payload = {
        "format": FORMAT,
        "identity": identity,
        "round": int(round_index),
        "states": {
            int(site): {
                "step": int(st.step),
                "moment_step": st.moment_step,
                "moments": {
                    n: {k: to_host(t.detach()).contiguous() for k, t in m.items()}
                    for n, m in st.moments.items()
                },
            }
            for site, st in states.items()
        },
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    write_atomically(path, buf.getvalue())


def write_atomically(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` or what it held before, never a part: temporary file, fsync,
    rename over, directory fsync (so the rename itself survives a power loss)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_site_states(
    path: Path,
    identity: str,
    shapes: Mapping[str, tuple[int, ...]],
    hosted: Collection[int],
    device: torch.device | str = "cpu",
) -> LoadedStates:
    """The states saved at ``path`` for this run, checked against the model's ``shapes``.

    No file: empty. Another run's file: empty, with the reason. Sites not in ``hosted`` are
    dropped (they left this process). Raises ``SiteStateFileError`` naming the file for
    anything unreadable or inconsistent with the model.
    """
    if not path.exists():
        return LoadedStates({})
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, not a torch file, or unsafe content
        raise SiteStateFileError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise SiteStateFileError(f"{path}: not a site-state file (format {FORMAT!r} expected)")
    saved = raw.get("identity")
    if saved != identity:
        why = f"{path} holds run {saved!r}'s site states, this run is {identity!r}: starting fresh"
        return LoadedStates({}, fresh_because=why)
    round_index = raw.get("round")
    entries = raw.get("states")
    if not isinstance(round_index, int) or round_index < 0 or not isinstance(entries, dict):
        raise SiteStateFileError(f"{path}: missing or malformed 'round'/'states'")
    states: dict[int, SiteState] = {}
    dropped: list[int] = []
    for site, entry in entries.items():
        if not isinstance(site, int) or site < 0:
            raise SiteStateFileError(f"{path}: site key {site!r} is not a site index")
        state = _state(path, site, entry, shapes, device)
        if site in hosted:
            states[site] = state
        else:
            dropped.append(site)
    return LoadedStates(states, None, round_index, tuple(sorted(dropped)))


def _state(
    path: Path,
    site: int,
    entry: object,
    shapes: Mapping[str, tuple[int, ...]],
    device: torch.device | str,
) -> SiteState:
    """One site's entry, validated: a step >= 0 and moments of the model's names and shapes."""
    where = f"{path}: site {site}"
    if not isinstance(entry, dict) or set(entry) != {"step", "moment_step", "moments"}:
        raise SiteStateFileError(
            f"{where}: entry must have exactly 'step', 'moment_step' and 'moments'"
        )
    step, moment_step, moments = entry["step"], entry["moment_step"], entry["moments"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise SiteStateFileError(f"{where}: step {step!r} is not a non-negative integer")
    if moment_step is not None and (
        not isinstance(moment_step, int) or isinstance(moment_step, bool)
        or not 0 <= moment_step <= step
    ):  # fmt: skip
        raise SiteStateFileError(f"{where}: moment_step {moment_step!r} is not in [0, {step}]")
    if not isinstance(moments, dict):
        raise SiteStateFileError(f"{where}: moments is not a mapping")
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, kinds in moments.items():
        if name not in shapes:
            raise SiteStateFileError(f"{where}: tensor {name!r} is not in this model")
        if not isinstance(kinds, dict) or not set(kinds) <= KINDS:
            raise SiteStateFileError(f"{where}: {name!r} has moment kinds other than {KINDS}")
        out[name] = {}
        for kind, t in kinds.items():
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise SiteStateFileError(f"{where}: {name}.{kind} is not a float tensor")
            if tuple(t.shape) != tuple(shapes[name]):
                raise SiteStateFileError(
                    f"{where}: {name}.{kind} has shape {tuple(t.shape)}, the model's is "
                    f"{tuple(shapes[name])}"
                )
            out[name][kind] = t.to(device)
    return SiteState(step, out, moment_step)
