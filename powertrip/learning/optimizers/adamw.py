"""AdamW: torch's ``AdamW``, term for term.

Decoupled weight decay ``p *= 1 - lr * wd`` on tensors that ``decays`` (none elsewhere), then
``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`` with ``t`` the steps since the
row's moments began (its bias correction restarts when they do, as a fresh torch optimizer's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from powertrip.config.recipe import LocalOptimizer, decays
from powertrip.learning.optimizers.base import (
    EXP_AVG,
    EXP_AVG_SQ,
    OptimizerRule,
    RowStep,
    decay_groups,
    per_row,
    resolved_lr,
)

__all__ = ["ADAMW", "AdamWRule", "adamw_groups", "adamw_update"]


def adamw_update(
    step: RowStep, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]
) -> None:
    """AdamW's step of the tensors in ``grads`` (another rule may give it only some of a
    model's tensors, training the rest its own way)."""
    r, lr = step.recipe, step.lr
    b1, b2 = r.betas
    t = step.moment_steps
    bc1 = torch.tensor(1.0 - b1**t, dtype=lr.dtype, device=lr.device)
    bc2_sqrt = torch.tensor(np.sqrt(1.0 - b2**t), dtype=lr.dtype, device=lr.device)
    step_size = lr / bc1
    for name, g in grads.items():
        p = params[name]
        m = step.moments(name)
        exp_avg, exp_avg_sq = m[EXP_AVG.name], m[EXP_AVG_SQ.name]
        if r.weight_decay and decays(name, tuple(p.shape[1:])):
            p.mul_(1.0 - per_row(lr, p) * r.weight_decay)
        exp_avg.lerp_(g, 1.0 - b1)
        exp_avg_sq.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        denom = (exp_avg_sq.sqrt() / per_row(bc2_sqrt, g)).add_(r.eps)
        p.addcdiv_(exp_avg * per_row(-step_size, g), denom)


def adamw_groups(
    recipe: LocalOptimizer, named: Sequence[tuple[str, torch.Tensor]], fused: bool
) -> torch.optim.AdamW:
    """torch's AdamW over ``named`` with the recipe's betas, eps and decay groups."""
    groups = decay_groups(recipe, named, AdamWRule.kinds)
    kernel = {"fused": True} if fused else {}
    lr = resolved_lr(recipe)
    return torch.optim.AdamW(groups, lr=lr, betas=recipe.betas, eps=recipe.eps, **kernel)


class AdamWRule(OptimizerRule):
    kinds = (EXP_AVG, EXP_AVG_SQ)

    def update(
        self, step: RowStep, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]
    ) -> None:
        adamw_update(step, params, grads)

    def torch_optimizer(
        self, recipe: LocalOptimizer, named: Sequence[tuple[str, torch.Tensor]], fused: bool
    ) -> torch.optim.Optimizer:
        return adamw_groups(recipe, named, fused)


ADAMW = AdamWRule()
