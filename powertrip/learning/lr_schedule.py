"""Learning-rate schedules as a multiplier of the recipe's lr at a site's own local step.

Every site counts its own cumulative local steps (a site that trains more often is further
along its schedule), so the multiplier is computed per row from a vector of step counts.
``step`` is 0-based: the first update of a site uses ``factor(0)``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["lr_factors"]


def lr_factors(
    steps: np.ndarray,
    schedule: str,
    warmup_steps: int = 0,
    total_steps: int | None = None,
    min_lr_ratio: float = 0.0,
    decay_fraction: float = 0.2,
) -> np.ndarray:
    """The lr multiplier at each 0-based step in ``steps``: a linear warm-up to 1 over
    ``warmup_steps``, then ``constant`` 1, a ``cosine`` to ``min_lr_ratio`` at ``total_steps``,
    or ``wsd`` (warm-up, stable at 1, a linear decay to ``min_lr_ratio`` over the last
    ``decay_fraction`` of the post-warm-up steps). Past ``total_steps``: ``min_lr_ratio``."""
    t = np.asarray(steps, dtype=np.float64)
    out = np.ones_like(t)
    if schedule != "constant":
        if total_steps is None:
            raise ValueError(f"schedule {schedule!r} needs total_steps")
        span = max(total_steps - warmup_steps, 1)
        if schedule == "cosine":
            progress = np.clip((t - warmup_steps) / span, 0.0, 1.0)
            out = min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + np.cos(math.pi * progress))
        elif schedule == "wsd":
            decay = max(int(round(decay_fraction * span)), 1)
            start = total_steps - decay
            progress = np.clip((t - start) / decay, 0.0, 1.0)
            out = 1.0 - (1.0 - min_lr_ratio) * progress
        else:
            raise ValueError(f"unknown schedule {schedule!r}")
    if warmup_steps > 0:
        out = np.where(t < warmup_steps, (t + 1) / warmup_steps, out)
    return out
