"""A site's optimizer moments outside its ranks, so that they outlive them.

After every round each rank writes its rows of every moment (``shard_rows``, its FSDP2 shard,
exactly as it writes the update) into one memory-mapped float32 file per moment kind in the
group's directory; the parent reads them as a ``SiteState`` (the project's per-site state, the
one ``SiteOptimizer`` keeps), and fresh ranks, after a failure or in a new group given a state,
load them back into their torch optimizer, AdamW's step count included, so the next round is
the one the lost ranks would have trained.

The kinds are the recipe's rule's (``powertrip.learning.optimizers``): its ``MomentKind`` says
torch's key for each and whether torch counts steps beside it. A kind's file holds every tensor
of the model (zero where a tensor keeps no such moment: a rule may keep different kinds on
different tensors);
each torch param group names the kinds its tensors keep, and only those are loaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.device import to_host
from powertrip.learning.optimizers.base import MOMENTS, MomentKind
from powertrip.learning.optimizers.registry import moment_kinds as registered_kinds
from powertrip.learning.optimizers.registry import rule_for
from powertrip.learning.site_engine.files import Layout, TensorFile
from powertrip.learning.site_optim import SiteState

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["MomentFiles", "export_moments", "export_noted", "import_moments", "moment_kinds"]


def moment_kinds(recipe: LocalOptimizer) -> tuple[str, ...]:
    """The moments ``recipe`` keeps across rounds (its rule's kinds, ``SiteOptimizer``'s); none
    for plain sgd or ``keep_state=False``, whose moments never outlive a round."""
    if not recipe.keep_state:
        return ()
    return tuple(k.name for k in rule_for(recipe).kept(recipe))


def _kept(opt: torch.optim.Optimizer, files: MomentFiles) -> dict[int, list[MomentKind]]:
    """id(parameter) -> the kinds of ``files`` it keeps: those its param group names
    (``MOMENTS``: a rule's groups do), or every kind of the files for a group naming none."""
    catalogue = registered_kinds()
    unknown = [k for k in files.files if k not in catalogue]
    if unknown:
        raise ValueError(f"moment kind {unknown[0]!r} is no registered optimizer's")
    return {
        id(p): [catalogue[k] for k in g.get(MOMENTS, files.files) if k in files.files]
        for g in opt.param_groups
        for p in g["params"]
    }


class MomentFiles:
    """One ``TensorFile`` per moment kind, the model's layout (``moments.<kind>.f32``)."""

    def __init__(self, workdir: str | Path, layout: Layout, kinds, create: bool = False) -> None:
        self.layout = layout
        self.files = {
            k: TensorFile(Path(workdir) / f"moments.{k}.f32", layout, create=create) for k in kinds
        }

    def __bool__(self) -> bool:
        return bool(self.files)

    def state(self, step: int, moment_step: int) -> SiteState:
        """The site's state from the files (copies: the next round overwrites them); none
        when ``moment_step`` is 0 (no moments yet, or none kept)."""
        if not self.files or moment_step == 0:
            return SiteState(step, {}, 0)
        moments = {
            name: {k: f[name].clone() for k, f in self.files.items()} for name, _ in self.layout
        }
        return SiteState(step, moments, None if moment_step == step else moment_step)

    def write(self, state: SiteState) -> int:
        """A ``SiteState``'s moments in (a name or kind it lacks: zero, a fresh moment); the
        moments' step count."""
        moments, shapes = state.moments, dict(self.layout)
        for name, m in moments.items():
            for kind, t in m.items():
                if shapes.get(name) != tuple(t.shape):
                    raise ValueError(f"moment {name}/{kind} {tuple(t.shape)} is not the model's")
        for kind, f in self.files.items():
            for name in shapes:
                given = moments.get(name, {}).get(kind)
                f[name].zero_() if given is None else f[name].copy_(given)
        return int(state.step if state.moment_step is None else state.moment_step)

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def export_moments(
    opt: torch.optim.Optimizer,
    params: Mapping[str, torch.Tensor],
    files: MomentFiles,
    rows: Callable[[torch.Tensor], slice | None],
    fsdp: bool,
) -> int:
    """Write this rank's rows of every moment (``rows(p)``, as the update's); the steps since
    the moments began (AdamW's ``state[p]["step"]``; 0 when torch keeps no count)."""
    step = 0
    kept = _kept(opt, files)
    for name, p in params.items():
        st = opt.state.get(p, {})
        keys = {k.name: k.torch_key for k in kept[id(p)]}
        if "step" in st and any(k.counted for k in kept[id(p)]):
            step = int(st["step"])
        r = rows(p)
        if r is None:
            continue
        for kind, f in files.files.items():
            t = st.get(keys[kind]) if kind in keys else None
            if t is None:  # no step since the moments began, or none of this kind: zero
                f[name][r].zero_()
                continue
            mine = _local(t) if fsdp else t[r]
            f[name][r].copy_(to_host(mine))
    return step


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 tensor (a DTensor: a parameter or its optimizer state)."""
    return cast("DTensor", t).to_local()


def export_noted(conns) -> bool:
    """Whether a rank's unread messages (its pipe drained after it ended) say it began writing
    the moments: each says so first, so files it may have half written are never loaded."""
    noted = False
    for c in conns:
        with contextlib.suppress(EOFError, OSError):
            while c.poll():
                noted |= c.recv()[0] == "exporting"
    return noted


@torch.no_grad()
def import_moments(
    opt: torch.optim.Optimizer,
    params: Mapping[str, torch.Tensor],
    files: MomentFiles,
    rows: Callable[[torch.Tensor], slice | None],
    fsdp: bool,
    step: int,
    fused: bool,
) -> None:
    """Replace the optimizer's state with the files' moments: the whole tensor under DDP, this
    rank's shard (the DTensor's local part) under FSDP2, and AdamW's step count."""
    opt.state.clear()
    kept = _kept(opt, files)
    for name, p in params.items():
        st: dict = {}
        for kind in kept[id(p)]:
            f = files.files[kind.name]
            buf = torch.zeros_like(p, memory_format=torch.preserve_format)
            if fsdp and p.dim() > 0:
                _local(buf).copy_(f[name][rows(p)])
            elif fsdp:
                _local(buf).copy_(f[name])
            else:
                buf.copy_(f[name])
            st[kind.torch_key] = buf
        if any(k.counted for k in kept[id(p)]):  # torch's own placement: on the device for
            # the fused kernel, else the host
            where = p.device if fused else torch.device("cpu")
            st["step"] = torch.tensor(float(step), dtype=torch.float32, device=where)
        if st:
            opt.state[p] = st
