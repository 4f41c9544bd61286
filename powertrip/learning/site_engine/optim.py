"""The local optimizer recipe (``LocalOptimizer``) as a ``torch.optim`` optimizer.

``SiteOptimizer`` (site_optim.py) is the reference; torch's optimizers compute the same
update, term for term:

- ``sgd``: ``SGD(momentum=0)``; ``momentum``/``nesterov``: ``SGD(momentum=m[, nesterov])``,
  whose first step starts the buffer at the gradient, as the reference's zero buffer does;
  weight decay is L2 (added to the gradient), only in the param group of tensors that
  ``decays``.
- ``adamw``: ``AdamW(betas, eps)`` with decoupled decay ``p *= 1 - lr * wd`` in the decaying
  group and 0 elsewhere (torch's default 1e-2 is never left in), bias correction on the steps
  since the moments began.
- the schedule: each step's lr is the recipe's lr times ``lr_factors`` at the site's
  cumulative 0-based step, set on every group before the step; clipping is
  ``clip_grad_norm_`` on the site's global norm (DTensor-aware under FSDP2), before the step.
- ``keep_state=False``: the moments are dropped at the start of a round (and with them AdamW's
  bias-correction count) while the schedule keeps the site's cumulative step.

Every recipe the reference accepts maps exactly (tests/unit/test_site_engine_recipes.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from powertrip.config.recipe import LocalOptimizer, decays
from powertrip.learning.lr_schedule import lr_factors

__all__ = ["build_optimizer", "round_lrs"]


def build_optimizer(
    recipe: LocalOptimizer, named: Iterable[tuple[str, torch.Tensor]], fused: bool = False
) -> torch.optim.Optimizer:
    """The torch optimizer for ``recipe`` over ``named`` parameters (their unwrapped names and
    full shapes: a DTensor's ``shape`` is the global one). ``fused``: the fused CUDA kernels."""
    if recipe.lr is None:
        raise ValueError("the recipe's lr must be resolved (LocalOptimizer.with_lr)")
    decay, plain = [], []
    for name, p in named:
        (decay if decays(name, tuple(p.shape)) else plain).append(p)
    wd = recipe.weight_decay
    groups = [
        g
        for g in ({"params": decay, "weight_decay": wd}, {"params": plain, "weight_decay": 0.0})
        if g["params"]
    ]
    kernel = {"fused": True} if fused else {}
    if recipe.name == "adamw":
        return torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, eps=recipe.eps, **kernel)
    momentum = 0.0 if recipe.name == "sgd" else recipe.momentum
    nesterov = recipe.name == "nesterov" and momentum > 0  # at 0, nesterov is plain SGD
    return torch.optim.SGD(groups, lr=recipe.lr, momentum=momentum, nesterov=nesterov, **kernel)


def round_lrs(recipe: LocalOptimizer, first_step: int, steps: int) -> np.ndarray:
    """The lr of each of a round's ``steps`` steps, the site having taken ``first_step``."""
    r = recipe
    t = np.arange(first_step, first_step + steps)
    factors = lr_factors(
        t, r.schedule, r.warmup_steps, r.total_steps, r.min_lr_ratio, r.decay_fraction
    )
    return float(r.lr) * factors


def reset_moments(opt: torch.optim.Optimizer) -> None:
    """Fresh moments (and AdamW step counts) for every parameter: torch creates them again,
    zero, at the next step."""
    opt.state.clear()
