"""The local optimizer recipe (``LocalOptimizer``) as a ``torch.optim`` optimizer.

The recipe's rule (``powertrip.learning.optimizers``) builds it (torch's ``SGD`` for the SGD
family, ``AdamW`` for AdamW, ...), computing the update of ``SiteOptimizer`` (the reference)
term for term, with weight decay only in the param group of
tensors that ``decays`` (torch's default decay is never left in). What every rule shares is
here:

- the schedule: each step's lr is the recipe's lr times ``lr_factors`` at the site's
  cumulative 0-based step, set on every group before the step (``round_lrs``); clipping is
  ``clip_grad_norm_`` on the site's global norm (DTensor-aware under FSDP2), before the step.
- ``keep_state=False``: the moments are dropped at the start of a round (and with them AdamW's
  bias-correction count) while the schedule keeps the site's cumulative step.

Every recipe the reference accepts maps exactly (tests/unit/test_site_engine_recipes.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.lr_schedule import lr_factors
from powertrip.learning.optimizers.base import resolved_lr
from powertrip.learning.optimizers.registry import rule_for

__all__ = ["build_optimizer", "reset_moments", "round_lrs"]


def build_optimizer(
    recipe: LocalOptimizer, named: Iterable[tuple[str, torch.Tensor]], fused: bool = False
) -> torch.optim.Optimizer:
    """The torch optimizer for ``recipe`` over ``named`` parameters (their unwrapped names and
    full shapes: a DTensor's ``shape`` is the global one). ``fused``: the fused CUDA kernels."""
    resolved_lr(recipe)
    return rule_for(recipe).torch_optimizer(recipe, list(named), fused)


def round_lrs(recipe: LocalOptimizer, first_step: int, steps: int) -> np.ndarray:
    """The lr of each of a round's ``steps`` steps, the site having taken ``first_step``."""
    r = recipe
    t = np.arange(first_step, first_step + steps)
    factors = lr_factors(
        t, r.schedule, r.warmup_steps, r.total_steps, r.min_lr_ratio, r.decay_fraction
    )
    return resolved_lr(r) * factors


def reset_moments(opt: torch.optim.Optimizer) -> None:
    """Fresh moments (and AdamW step counts) for every parameter: torch creates them again,
    zero, at the next step."""
    opt.state.clear()
