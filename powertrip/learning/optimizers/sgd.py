"""SGD, with heavy-ball (``momentum``) or Nesterov momentum: torch's ``SGD``, term for term.

Weight decay is L2, added to the gradient, only on tensors that ``decays``. The momentum
buffer starts at zero, so its first step is the gradient, as torch's first step is; at momentum
0 there is no buffer and the update is plain SGD's (torch's ``nesterov=True`` with no momentum
is an error, here it is plain SGD).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from powertrip.config.recipe import LocalOptimizer, decays
from powertrip.learning.optimizers.base import (
    MOMENTUM,
    MomentKind,
    OptimizerRule,
    RowStep,
    decay_groups,
    per_row,
    resolved_lr,
)

__all__ = ["MOMENTUM_SGD", "NESTEROV", "SGD", "SGDRule"]


class SGDRule(OptimizerRule):
    """``p -= lr * (g [+ wd p])``, through a momentum buffer unless ``variant`` is plain."""

    kinds = (MOMENTUM,)

    def __init__(self, variant: str) -> None:
        if variant not in ("plain", "momentum", "nesterov"):
            raise ValueError(f"SGD variant {variant!r} is not plain, momentum or nesterov")
        self.variant = variant

    def _momentum(self, recipe: LocalOptimizer) -> float:
        return 0.0 if self.variant == "plain" else recipe.momentum

    def kept(self, recipe: LocalOptimizer) -> tuple[MomentKind, ...]:
        return (MOMENTUM,) if self._momentum(recipe) else ()

    def update(
        self, step: RowStep, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]
    ) -> None:
        r, lr = step.recipe, step.lr
        mu = self._momentum(r)
        for name, g in grads.items():
            p = params[name]
            if r.weight_decay and decays(name, tuple(p.shape[1:])):
                g = g.add(p, alpha=r.weight_decay)
            if mu:
                buf = step.moments(name)[MOMENTUM.name]
                buf.mul_(mu).add_(g)  # a fresh (zero) buffer starts at g, as torch's
                g = g.add(buf, alpha=mu) if self.variant == "nesterov" else buf
            p.sub_(g * per_row(lr, g))

    def torch_optimizer(
        self, recipe: LocalOptimizer, named: Sequence[tuple[str, torch.Tensor]], fused: bool
    ) -> torch.optim.Optimizer:
        mu = self._momentum(recipe)
        groups = decay_groups(recipe, named, self.kept(recipe))
        kernel = {"fused": True} if fused else {}
        nesterov = self.variant == "nesterov" and mu > 0
        return torch.optim.SGD(
            groups, lr=resolved_lr(recipe), momentum=mu, nesterov=nesterov, **kernel
        )


SGD = SGDRule("plain")
MOMENTUM_SGD = SGDRule("momentum")
NESTEROV = SGDRule("nesterov")
