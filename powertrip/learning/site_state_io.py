"""Saving and loading per-site state (``SiteState`` and an error-feedback residual) as one file.

A process that keeps sites' state between rounds (a services worker, through its
``SiteStateBook``) writes it here after each round, so a restart resumes every site
bit-identically instead of from zero moments and an empty residual. One site's entry is
``{"step", "moment_step", "moments"}`` (its ``SiteState``) plus, only when the site has one, a
``"residual"`` (tensor name -> float32 tensor): files written before residuals existed read as
they did. The file is replaced atomically (temporary file, fsync, ``os.replace``, directory
fsync): a crash mid-write leaves the previous file whole. It records the run's identity, so a
state from another run is never resumed, and what is read back is data, not trust: it is bounded
by the model (names, shapes, the moment kinds the recipe's rule declares), its step counts must
be whole numbers in range and its moments and residual finite (``read_entry``: the one check
every load goes through). What fails that is not resumed (the site starts fresh) and is reported in
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

import numpy as np
import torch

from powertrip.learning.device import array, tensor, to_host
from powertrip.learning.optimizers.registry import moment_kinds
from powertrip.learning.site_optim import SiteState

__all__ = [
    "FORMAT",
    "Kinds",
    "LoadedStates",
    "Residual",
    "entry_payload",
    "load_site_states",
    "read_entry",
    "run_identity",
    "save_site_states",
    "set_aside",
    "unreadable_because",
]

FORMAT = "powertrip-site-states/1"
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's archive format begins so
_FIELDS = {"step", "moment_step", "moments"}
#: a site's error-feedback residual: tensor name -> what its codec has not sent yet (float32)
Residual = Mapping[str, np.ndarray]
#: tensor name -> the moment kinds it may keep (the recipe's rule's plan for the model)
Kinds = Mapping[str, Collection[str]]


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
    #: the error-feedback residuals of the sites in ``states`` that had one
    residuals: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def trusted(self) -> bool:
        """Whether everything in the file could be used (else it is to be set aside)."""
        return self.unusable is None and not self.refused


def run_identity(run_config_json: str, run_seed: int) -> str:
    """A short digest naming one run: its configuration and seed."""
    digest = hashlib.sha256(f"{run_seed}\n{run_config_json}".encode()).hexdigest()
    return digest[:16]


def save_site_states(
    path: Path,
    states: Mapping[int, SiteState | None],
    identity: str,
    round_index: int,
    residuals: Mapping[int, Residual | None] | None = None,
) -> None:
    """Write ``states`` (moments moved to the CPU) and ``residuals`` to ``path`` atomically; a
    site with a residual but no state (plain SGD under a codec) is saved at step 0."""
    residuals = residuals or {}
    payload = {
        "format": FORMAT,
        "identity": identity,
        "round": int(round_index),
        "states": {
            int(site): entry_payload(states.get(site), residuals.get(site))
            for site in sorted({*states, *residuals})
        },
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    write_atomically(path, buf.getvalue())


def entry_payload(state: SiteState | None, residual: Residual | None = None) -> dict:
    """One site's entry as saved: host tensors only (``torch.load(weights_only=True)`` reads
    it back); no ``"residual"`` key when the site has none."""
    st = state if state is not None else SiteState(0, {})
    out: dict = {
        "step": int(st.step),
        "moment_step": st.moment_step,
        "moments": {
            n: {k: to_host(t.detach()).contiguous() for k, t in m.items()}
            for n, m in st.moments.items()
        },
    }
    if residual:
        out["residual"] = {n: tensor(np.array(r, np.float32)) for n, r in residual.items()}
    return out


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
    kinds: Kinds | None = None,
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
    residuals: dict[int, dict[str, np.ndarray]] = {}
    refused: dict[int, str] = {}
    dropped: list[int] = []
    for site, entry in sorted(entries.items()):
        if site not in hosted:
            dropped.append(site)
            continue
        read = read_entry(entry, shapes, kinds)
        if isinstance(read, str):
            refused[site] = read
            continue
        state, residual = read
        states[site] = _to(state, device)
        if residual is not None:
            residuals[site] = residual
    return LoadedStates(states, round_index, tuple(dropped), refused=refused, residuals=residuals)


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


def read_entry(
    entry: object, shapes: Mapping[str, tuple[int, ...]], kinds: Kinds | None = None
) -> tuple[SiteState, dict[str, np.ndarray] | None] | str:
    """One site's saved entry as its ``SiteState`` and residual, or why it cannot be resumed,
    in plain words: the one validation every load goes through (a file's entry, a
    checkpoint's). The state is held to ``SiteState.problem`` (the rule a freshly trained state
    is held to); its moment kinds to ``kinds`` (each tensor's, as the recipe's rule plans
    them; None: any registered kind); the residual to the model's shapes, float32 and finite."""
    if not isinstance(entry, dict) or not _FIELDS <= set(entry) <= {*_FIELDS, "residual"}:
        return "damaged entry (not exactly 'step', 'moment_step' and 'moments')"
    moments = entry["moments"]
    known = set(moment_kinds())  # the kinds the registered optimizers' rules declare
    if not isinstance(moments, dict) or not all(
        isinstance(kinds, dict) and set(kinds) <= known for kinds in moments.values()
    ):
        return f"damaged entry (moment kinds other than {sorted(known)})"
    state = SiteState(entry["step"], moments, entry["moment_step"])
    why = state.problem(shapes)
    if why is None and kinds is not None:
        why = _kinds_problem(moments, kinds)
    if why is None and "residual" in entry:
        why = _residual_problem(entry["residual"], shapes)
    if why is not None:
        return why
    residual = entry.get("residual")
    return state, None if residual is None else {n: array(t) for n, t in residual.items()}


def _kinds_problem(moments: Mapping[str, Mapping[str, object]], kinds: Kinds) -> str | None:
    """A tensor keeping a kind of moment the recipe's rule does not plan for it."""
    for name, m in moments.items():
        extra = sorted(set(m) - set(kinds.get(name, ())))
        if extra:
            planned = ", ".join(sorted(kinds.get(name, ()))) or "none"
            return f"moments the recipe does not keep ({extra[0]} of {name!r}; it keeps {planned})"
    return None


def _residual_problem(residual: object, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why a saved error-feedback residual cannot be added to the next update (None: it can)."""
    if not isinstance(residual, dict):
        return "damaged entry (its residual is not a table of tensors)"
    for name, t in residual.items():
        if name not in shapes:
            return f"residual of another model (this model has no tensor {name!r})"
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            return f"residual of {name!r} is not a float32 tensor"
        if tuple(t.shape) != tuple(shapes[name]):
            return (
                f"residual of another model ({name!r} has shape {tuple(t.shape)}, "
                f"this model's is {tuple(shapes[name])})"
            )
        if not bool(torch.isfinite(t).all()):
            return f"non-finite residual (in {name!r})"
    return None


def _to(state: SiteState, device: torch.device | str) -> SiteState:
    moments = {n: {k: t.to(device) for k, t in m.items()} for n, m in state.moments.items()}
    return SiteState(int(state.step), moments, state.moment_step)
