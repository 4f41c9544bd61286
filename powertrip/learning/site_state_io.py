"""Saving and loading per-site local optimizer states (``SiteState``) as one file.

A process that keeps sites' optimizer states between rounds (a services worker) writes them
here after each round, so a restart resumes every site bit-identically instead of from zero
moments. The file is replaced atomically (temporary file, fsync, ``os.replace``, directory
fsync): a crash mid-write leaves the previous file whole. It records the run's identity, so a
state from another run is never resumed, and what is read back is data, not trust: it is bounded
by the model (names, shapes, moment kinds), its step counts must be whole numbers in range and
its moments finite. What fails that is not resumed (the site starts fresh) and is reported in
plain words; the caller sets the file aside (``set_aside``) and keeps running, since a worker
that stopped on a bad file would only be restarted onto it again.

Tensors go through ``torch.save`` and come back through ``torch.load(weights_only=True)`` (no
pickled code runs), so every dtype round-trips bit for bit.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import time
import zipfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from powertrip.learning.device import to_host
from powertrip.learning.optimizers.registry import moment_kinds
from powertrip.learning.site_optim import SiteState

__all__ = [
    "FORMAT",
    "LoadedStates",
    "load_site_states",
    "run_identity",
    "save_site_states",
    "set_aside",
    "unreadable_because",
]

FORMAT = "powertrip-site-states/1"
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's archive format begins so


@dataclass(frozen=True)
class LoadedStates:
    """What a load found: the states to resume (empty when starting fresh), the round they
    were saved after, and what could not be trusted, in plain words (for one log line)."""

    states: dict[int, SiteState]
    round: int | None = None
    dropped: tuple[int, ...] = ()  # saved sites this process no longer hosts
    #: why nothing in the file is used (None: it was read)
    unusable: str | None = None
    #: hosted sites whose saved state is not resumed (they start fresh), and why
    refused: Mapping[int, str] = field(default_factory=dict)

    @property
    def trusted(self) -> bool:
        """Whether everything in the file could be used (else it is to be set aside)."""
        return self.unusable is None and not self.refused


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
    """The states saved at ``path`` for this run that can be trusted, checked against the
    model's ``shapes``: the one validation every host's load goes through.

    Never raises for what the file holds (a worker must keep serving): a file that cannot be
    used at all comes back empty with ``unusable`` saying why in plain words (empty, truncated,
    not a state file, another run's); a hosted site whose entry is damaged or wrong (a bad step
    count, another model's shapes, non-finite moments) is left out, with its reason in
    ``refused``. Sites not in ``hosted`` are dropped (they left this process). No file: empty.
    """
    if not path.exists():
        return LoadedStates({})
    try:
        data = path.read_bytes()
    except OSError as exc:
        return LoadedStates({}, unusable=f"cannot be read ({exc.strerror or exc})")
    try:
        raw = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # whatever the library says, the file is unusable
        return LoadedStates({}, unusable=unreadable_because(data, exc))
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        tag = raw.get("format") if isinstance(raw, dict) else None
        held = f"format {tag!r}" if isinstance(tag, str) else "a torch file holding something else"
        return LoadedStates({}, unusable=f"not a site-state file ({held})")
    saved = raw.get("identity")
    if saved != identity:
        return LoadedStates(
            {}, unusable=f"another run's states (run {saved!r}; this run is {identity!r})"
        )
    round_index, entries = raw.get("round"), raw.get("states")
    if not isinstance(round_index, int) or round_index < 0 or not isinstance(entries, dict):
        return LoadedStates({}, unusable="damaged (no valid round number or site table)")
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in entries):
        keys = [s for s in entries if isinstance(s, bool) or not isinstance(s, int) or s < 0]
        return LoadedStates({}, unusable=f"damaged (site key {keys[0]!r} is not a site index)")
    states: dict[int, SiteState] = {}
    refused: dict[int, str] = {}
    dropped: list[int] = []
    for site, entry in sorted(entries.items()):
        if site not in hosted:
            dropped.append(site)
            continue
        state, why = _state(entry, shapes)
        if why is not None or state is None:
            refused[site] = why or "damaged entry"
        else:
            states[site] = _to(state, device)
    return LoadedStates(states, round_index, tuple(dropped), refused=refused)


def unreadable_because(data: bytes, exc: BaseException) -> str:
    """Why bytes that ``torch.load`` refused are not a state file, in plain words: a library's
    own message (its advice on ``weights_only``, an errno) means nothing to the user."""
    if not data:
        return "empty (0 bytes)"
    if not data.startswith(_ZIP_MAGIC):
        return f"not a state file ({len(data)} bytes, not in the saved-tensor format)"
    if not zipfile.is_zipfile(io.BytesIO(data)):
        return f"truncated ({len(data)} bytes; the end of the file is missing)"
    if isinstance(exc, pickle.UnpicklingError):
        return "not a state file (it holds Python objects a state file never has)"
    return f"damaged ({len(data)} bytes that do not read back as a state file)"


def set_aside(path: Path) -> Path:
    """Rename ``path`` to ``<name>.bad-<UTC time>`` next to it (kept for a person to look at,
    never read again) and return the new path; a name already taken gets a counter."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.bad-{stamp}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.bad-{stamp}-{n}")
        n += 1
    os.rename(path, aside)
    return aside


def _state(
    entry: object, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[SiteState | None, str | None]:
    """One site's entry as a ``SiteState``, or why it cannot be one (``SiteState.problem``:
    the same rule a freshly trained state is held to)."""
    if not isinstance(entry, dict) or set(entry) != {"step", "moment_step", "moments"}:
        return None, "damaged entry (not exactly 'step', 'moment_step' and 'moments')"
    moments = entry["moments"]
    known = set(moment_kinds())  # the kinds the registered optimizers' rules declare
    if not isinstance(moments, dict) or not all(
        isinstance(kinds, dict) and set(kinds) <= known for kinds in moments.values()
    ):
        return None, f"damaged entry (moment kinds other than {sorted(known)})"
    state = SiteState(entry["step"], moments, entry["moment_step"])
    why = state.problem(shapes)
    return (None, why) if why is not None else (state, None)


def _to(state: SiteState, device: torch.device | str) -> SiteState:
    moments = {n: {k: t.to(device) for k, t in m.items()} for n, m in state.moments.items()}
    return SiteState(int(state.step), moments, state.moment_step)
