"""The local optimizer recipe: what each site runs for its local steps, validated once.

Every engine (vmap, stacked chain, compiled, one site at a time) applies the same recipe
through one seam, ``SiteOptimizer`` (site_optim.py), so a recipe means the same thing
wherever it trains. The default, plain SGD at a constant lr, is exactly the trainer's old
``p -= lr * g``. A schedule's ``total_steps`` counts each site's own cumulative local steps
across the rounds that pick it, whether its moments are kept (``keep_state``: DiLoCo's inner
AdamW) or reset every round (the curtailment paper's inner optimizer).
"""

from __future__ import annotations

import math
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["LocalOptimizer", "LocalOptimizerSettings", "OptimizerName", "ScheduleName", "decays"]

OptimizerName = Literal["sgd", "momentum", "nesterov", "adamw"]
ScheduleName = Literal["constant", "cosine", "wsd"]


class LocalOptimizer(BaseModel):
    """A site's local optimizer, lr schedule, weight decay and gradient clipping."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: OptimizerName = "sgd"
    #: the peak lr; None: the workload's learning rate (``with_lr`` fills it in)
    lr: float | None = Field(None, gt=0, allow_inf_nan=False)
    momentum: float = Field(0.9, ge=0, lt=1)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0, allow_inf_nan=False)
    #: AdamW: decoupled; sgd/momentum/nesterov: added to the gradient (L2). Never on 1-D
    #: parameters (biases, norm weights) nor tensors named as embeddings (``decays``).
    weight_decay: float = Field(0.0, ge=0, allow_inf_nan=False)
    schedule: ScheduleName = "constant"
    warmup_steps: int = Field(0, ge=0)
    total_steps: int | None = Field(None, ge=1)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    decay_fraction: float = Field(0.2, gt=0, le=1)  # wsd: the decaying tail of the schedule
    #: each site's own global gradient norm is clipped to this (torch's clip_grad_norm_)
    clip_norm: float | None = Field(None, gt=0, allow_inf_nan=False)
    #: True: moments persist across a site's rounds; False: fresh moments (and AdamW bias
    #: correction) each round. The step count, and so the schedule's position, always persists.
    keep_state: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must each be in [0, 1), got {self.betas}")
        if self.schedule != "constant" and self.total_steps is None:
            raise ValueError(f"total_steps is required for the {self.schedule!r} schedule")
        if self.total_steps is not None and self.warmup_steps > self.total_steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) exceeds total_steps ({self.total_steps})"
            )
        return self

    def with_lr(self, lr: float) -> LocalOptimizer:
        """This recipe with ``lr`` as its peak lr when it has none of its own."""
        if self.lr is not None:
            return self
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {lr}")
        return self.model_copy(update={"lr": float(lr)})

    def check_fits(self, max_site_steps: int, why: str) -> None:
        """A schedule must end within the run: past the most local steps any site can take
        (``max_site_steps``, explained by ``why``) its decay would never finish."""
        if self.total_steps is not None and self.total_steps > max_site_steps:
            raise ValueError(
                f"local_optimizer.total_steps ({self.total_steps}) is longer than the run: a "
                f"site takes at most {max_site_steps} local steps ({why})"
            )

    @property
    def carries_over(self) -> bool:
        """Whether a site's round depends on its earlier rounds: moments kept across rounds
        (``keep_state``), or an lr that follows the site's cumulative step count (a schedule or
        a warm-up, which run on cumulative steps even when the moments are reset)."""
        kept_moments = self.keep_state and self.name != "sgd"
        return kept_moments or self.schedule != "constant" or self.warmup_steps > 0

    @property
    def plain_sgd(self) -> bool:
        """Whether the update is exactly ``p -= lr * g`` (the engines' in-graph fast path)."""
        return (
            self.name == "sgd"
            and self.schedule == "constant"
            and self.warmup_steps == 0
            and self.weight_decay == 0
            and self.clip_norm is None
        )


def decays(name: str, param_shape: tuple[int, ...]) -> bool:
    """Whether weight decay applies to a parameter: not to biases and norm weights (1-D),
    nor to tensors whose name says ``emb``. Only the name says what a tensor is here: the
    project's GPT names its tables ``tok``/``pos`` and so decays them, as nanoGPT does."""
    return len(param_shape) >= 2 and "emb" not in name.lower()


class LocalOptimizerSettings(BaseModel):
    """The run configurations' ``local_optimizer`` (both modes inherit it): None is the
    workload's plain SGD, and is left out of dumps so existing summaries do not change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    local_optimizer: LocalOptimizer | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description='Each site\'s local optimizer as a recipe, e.g. {"name": "adamw", "lr": 0.001} '
        "(unset: the workload's plain SGD).",
    )
