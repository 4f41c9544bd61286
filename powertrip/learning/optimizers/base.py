"""What an optimizer rule is: its state, its batched update and its ``torch.optim`` twin.

A rule is the whole of one optimizer's math, stated once for both kinds of engine:

- its **state**: the moments each tensor keeps (``MomentKind``: the name a site's state and its
  files use, torch's key for the same tensor, and what a sound value is). A moment has the shape
  and dtype of its tensor, stacked per site as ``[rows, *shape]``;
- its **batched update** (``update``): one step of the active rows ``[:a]`` of every stacked
  tensor, what ``SiteOptimizer`` runs for the vmap, stacked, compiled and one-site engines. The
  parts every rule shares (the step counts, each row's scheduled lr, the per-site gradient
  clip) are done before it is called (``RowStep``);
- its **torch optimizer** (``torch_optimizer``) for the rank engine (DDP/FSDP2), computing the
  same update term for term; that engine sets every param group's ``lr`` to the scheduled one
  before each step and clips first.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from powertrip.config.recipe import LocalOptimizer, decays

__all__ = [
    "EXP_AVG",
    "EXP_AVG_SQ",
    "MOMENTS",
    "MOMENTUM",
    "MomentKind",
    "OptimizerRule",
    "RowStep",
    "decay_groups",
    "per_row",
    "resolved_lr",
]

#: the key a ``torch.optim`` param group of a rule carries: the moments its tensors keep
MOMENTS = "moments"


@dataclass(frozen=True)
class MomentKind:
    """One kind of moment: its name in a site's state and on disk, torch's per-parameter state
    key for it, and what a sound value is."""

    name: str
    torch_key: str
    #: a second moment: never negative (a root is taken of it)
    nonnegative: bool = False
    #: torch keeps a per-parameter ``step`` beside it (Adam's bias correction)
    counted: bool = False


EXP_AVG = MomentKind("exp_avg", "exp_avg", counted=True)
EXP_AVG_SQ = MomentKind("exp_avg_sq", "exp_avg_sq", nonnegative=True, counted=True)
MOMENTUM = MomentKind("momentum", "momentum_buffer")


@dataclass(frozen=True)
class RowStep:
    """What a rule's batched update is given for one step of rows ``[:active]``."""

    recipe: LocalOptimizer
    active: int
    #: each row's lr for this step [active] (the recipe's schedule at the row's own step)
    lr: torch.Tensor
    #: each row's steps since its moments began, this one included [active]
    moment_steps: np.ndarray
    #: a tensor's moments by kind name, rows ``[:active]`` (zero when new)
    moments: Callable[[str], Mapping[str, torch.Tensor]]


class OptimizerRule(ABC):
    """One optimizer. Subclasses state ``kinds`` and implement the two updates."""

    #: every kind of moment the rule may keep (the catalogue a site's saved state is read by)
    kinds: ClassVar[tuple[MomentKind, ...]] = ()

    def kept(self, recipe: LocalOptimizer) -> tuple[MomentKind, ...]:
        """The kinds some tensor keeps under ``recipe`` (the rank engine's moment files)."""
        return self.kinds

    def moments(
        self, recipe: LocalOptimizer, shapes: Mapping[str, tuple[int, ...]]
    ) -> dict[str, tuple[MomentKind, ...]]:
        """The moments each tensor of a model of ``shapes`` (per site, in the model's order)
        keeps under ``recipe``; by default every kept kind for every tensor."""
        kept = self.kept(recipe)
        return dict.fromkeys(shapes, kept)

    @abstractmethod
    def update(
        self, step: RowStep, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]
    ) -> None:
        """One step of ``params`` (rows ``[:active]`` of each stacked tensor) in place, from
        ``grads`` (the same rows, already clipped)."""

    @abstractmethod
    def torch_optimizer(
        self, recipe: LocalOptimizer, named: Sequence[tuple[str, torch.Tensor]], fused: bool
    ) -> torch.optim.Optimizer:
        """The ``torch.optim`` optimizer computing ``update`` for one site over ``named``
        parameters (unwrapped names, full shapes); ``fused``: torch's fused CUDA kernels where
        it has them. Each param group names the moments its tensors keep (``MOMENTS``)."""


def resolved_lr(recipe: LocalOptimizer) -> float:
    """The recipe's peak lr, which must have been filled in (``LocalOptimizer.with_lr``)."""
    if recipe.lr is None:
        raise ValueError("the recipe's lr must be resolved (LocalOptimizer.with_lr)")
    return recipe.lr


def per_row(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-row vector [a] shaped to broadcast over ``like`` [a, ...]."""
    return v.view(-1, *([1] * (like.dim() - 1)))


def decay_groups(
    recipe: LocalOptimizer,
    named: Iterable[tuple[str, torch.Tensor]],
    kinds: tuple[MomentKind, ...],
    **extra: Any,
) -> list[dict[str, Any]]:
    """torch param groups: the tensors that ``decays`` at the recipe's weight decay, the rest
    at none (torch's own default decay is never left in), empty groups left out."""
    decay: list[torch.Tensor] = []
    plain: list[torch.Tensor] = []
    for name, p in named:
        (decay if decays(name, tuple(p.shape)) else plain).append(p)
    names = tuple(k.name for k in kinds)
    return [
        {"params": ps, "weight_decay": wd, MOMENTS: names, **extra}
        for ps, wd in ((decay, recipe.weight_decay), (plain, 0.0))
        if ps
    ]
