"""The local optimizer recipe: what each site runs for its local steps, validated once.

``name`` is any registered optimizer (``powertrip.config.optimizers``: the built-ins and a
user's own), its math one rule in ``powertrip.learning.optimizers`` that every
engine applies (``SiteOptimizer`` over stacked sites, its ``torch.optim`` twin in the rank
engine), so a recipe means the same thing wherever it trains. The default, plain SGD at a
constant lr, is exactly the trainer's old ``p -= lr * g``. A schedule's ``total_steps`` counts
each site's own cumulative local steps across the rounds that pick it, whether its moments are
kept (``keep_state``: DiLoCo's inner AdamW) or reset every round (the curtailment paper's inner
optimizer).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from powertrip.config.fields import omitted_at_default
from powertrip.config.optimizers import optimizer_entry, optimizer_names

__all__ = [
    "MAX_LR",
    "MAX_WEIGHT_DECAY",
    "MIN_EPS",
    "LocalOptimizer",
    "LocalOptimizerSettings",
    "OptimizerName",
    "RecipeTooLong",
    "ScheduleName",
    "decays",
]


def _registered(name: str) -> str:
    optimizer_entry(name)  # an unknown name: the registered ones, in the error
    return name


def _name_choices(schema: dict[str, Any]) -> None:
    schema["enum"] = list(optimizer_names())  # the names registered when the schema is read


#: a registered optimizer's name (``powertrip.config.optimizers``): an open set, not a Literal
OptimizerName = Annotated[str, AfterValidator(_registered), Field(json_schema_extra=_name_choices)]
ScheduleName = Literal["constant", "cosine", "wsd"]

# Bounds on absurd values, not on good ones: each value past them makes every update NaN or
# destroys the model at the first step, so the run is refused at start instead of reporting
# READY and then failing every round with no word of the optimizer.
#: Far above any lr that trains here (the workloads' SGD rates are 0.01-0.8; AdamW's ~1e-3).
MAX_LR = 10.0
#: With ``lr * weight_decay >= 1`` a step scales a weight by ``1 - lr * wd <= 0`` (see below).
MAX_WEIGHT_DECAY = 1.0
#: Above the smallest normal float32 (1.2e-38): a smaller eps rounds to 0 in the moments'
#: dtype, and AdamW's ``m / (sqrt(v) + eps)`` is then 0/0 = NaN wherever a gradient is 0.
MIN_EPS = 1e-30


class RecipeTooLong(ValueError):
    """A schedule that cannot end within the run (``LocalOptimizer.check_fits``): a
    configuration error, reported by the entry points in one line naming their setting."""


class LocalOptimizer(BaseModel):
    """A site's local optimizer, lr schedule, weight decay and gradient clipping."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: OptimizerName = Field(
        "sgd",
        description="A registered optimizer; the settings it does not read are ignored (AdamW "
        "reads no momentum, SGD no betas).",
    )
    lr: float | None = Field(
        None,
        gt=0,
        le=MAX_LR,
        allow_inf_nan=False,
        description="The peak lr; unset: the run's learning rate (``with_lr`` fills it in).",
    )
    momentum: float = Field(
        0.9, ge=0, lt=1, description="momentum, nesterov: the momentum buffer's factor."
    )
    betas: tuple[float, float] = Field(
        (0.9, 0.95), description="AdamW: the moments' decay rates, beta1,beta2."
    )
    eps: float = Field(
        1e-8, gt=0, le=1, allow_inf_nan=False, description="AdamW: added to sqrt(v)."
    )
    weight_decay: float = Field(
        0.0,
        ge=0,
        le=MAX_WEIGHT_DECAY,
        allow_inf_nan=False,
        description="As each rule applies it (AdamW: decoupled; sgd, momentum, nesterov: added "
        "to the gradient, L2). Never on 1-D parameters (biases, norm weights) nor tensors named "
        "as embeddings.",
    )
    schedule: ScheduleName = Field(
        "constant",
        description="The lr over each site's cumulative local steps (cosine, wsd: up to "
        "total_steps).",
    )
    warmup_steps: int = Field(0, ge=0, description="Linear lr warm-up, in a site's local steps.")
    total_steps: int | None = Field(
        None, ge=1, description="The schedule's length, in a site's local steps."
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="cosine, wsd: the final lr as a share of the lr."
    )
    decay_fraction: float = Field(
        0.2, gt=0, le=1, description="wsd: the decaying tail, as a share of the schedule."
    )
    clip_norm: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Each site's global gradient norm is clipped to this (torch's "
        "clip_grad_norm_).",
    )
    keep_state: bool = Field(
        True,
        description="Keep each site's moments across its rounds, or start them fresh (and "
        "AdamW's bias correction) every round; the step count, and so the schedule's position, "
        "always persists.",
    )

    @field_validator("eps")
    @classmethod
    def _eps_survives_float32(cls, v: float) -> float:
        if v < MIN_EPS:
            raise ValueError(
                f"must be at least {MIN_EPS:g}, got {v:g}: a smaller eps rounds to 0 in "
                "float32, and m / (sqrt(v) + eps) is then 0/0 = NaN wherever a gradient is 0"
            )
        return v

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
        # Both decays scale a weight by (1 - lr * weight_decay) per step (AdamW directly, L2
        # through the gradient): at 1 or more every decayed weight is zeroed or flips sign.
        if self.lr is not None and self.lr * self.weight_decay >= 1:
            raise ValueError(
                f"lr x weight_decay must be below 1 (each step scales a weight by 1 - lr x "
                f"weight_decay), got {self.lr} x {self.weight_decay}"
            )
        return self

    def with_lr(self, lr: float) -> LocalOptimizer:
        """This recipe with ``lr`` as its peak lr when it has none of its own, validated as
        if it had been given (a workload's or a flag's lr meets the same bounds)."""
        if self.lr is not None:
            return self
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {lr}")
        given = {**self.model_dump(exclude_unset=True), "lr": float(lr)}
        try:
            return type(self).model_validate(given)
        except ValidationError as exc:  # one line, as the flag's or the setting's own would be
            msg = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            raise ValueError(f"lr {lr}: {msg}") from None

    def check_fits(self, max_site_steps: int, why: str) -> None:
        """A schedule must end within the run: past the most local steps any site can take
        (``max_site_steps``, explained by ``why``) its decay would never finish."""
        if self.total_steps is not None and self.total_steps > max_site_steps:
            raise RecipeTooLong(
                f"local_optimizer.total_steps ({self.total_steps}) is longer than the run: a "
                f"site takes at most {max_site_steps} local steps ({why})"
            )

    @property
    def carries_over(self) -> bool:
        """Whether a site's round depends on its earlier rounds: moments kept across rounds
        (``keep_state``), or an lr that follows the site's cumulative step count (a schedule or
        a warm-up, which run on cumulative steps even when the moments are reset)."""
        kept_moments = self.keep_state and optimizer_entry(self.name).moments
        return kept_moments or self.schedule != "constant" or self.warmup_steps > 0

    @property
    def plain_sgd(self) -> bool:
        """Whether the update is exactly ``p -= lr * g`` (the engines' in-graph fast path):
        plain SGD's rule at a constant lr, without decay or clipping."""
        return (
            optimizer_entry(self.name).plain
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

    local_optimizer: LocalOptimizer | None = omitted_at_default(
        None,
        'Each site\'s local optimizer as a recipe, e.g. {"name": "adamw", "lr": 0.001} '
        "(unset: the workload's plain SGD).",
    )
