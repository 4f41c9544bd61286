"""What a built-in workload trains with when a run does not say, declared once: its learning
rates and batch, its local optimizer, and the one way its samples split when it has only one.
The PowerTrip study (``ExperimentConfig``), the curtailment presets and the services' settings
all read this table.

The LM's local optimizer is the library's measured recipe (docs/workloads.md, "The reference
recipe" and "Through the library": 2.59-2.62 bits per byte at nanoGPT's CPU budget, where plain
SGD ends at 3.5-4.1): AdamW at lr 2e-3, betas 0.9/0.99, weight decay 0.1, gradient clipping at
norm 1.0, moments kept across a site's rounds, a warm-up then cosine to 5 % of the lr, batch 12
windows. Its schedule is stated as shares of the run (``RunRecipe``), not in steps, so it fits
whatever rounds x local steps a run has: ``RunRecipe.fit`` makes it a ``LocalOptimizer`` once
the most local steps a site can take are known.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from powertrip.config.optimizers import optimizer_entry
from powertrip.config.presets import layered_recipe
from powertrip.config.recipe import LocalOptimizer, ScheduleName
from powertrip.config.workloads import resolve_workload

__all__ = [
    "LM_RECIPE",
    "SCHEDULE_FIELDS",
    "WORKLOAD_DEFAULTS",
    "Partition",
    "RunRecipe",
    "WorkloadDefaults",
    "check_partition",
    "default_lr",
    "either_recipe",
    "layered_on",
    "with_workload_defaults",
    "workload_default",
]

Partition = Literal["iid", "dirichlet", "natural"]

#: the ``LocalOptimizer`` fields that state a schedule in steps: a recipe naming any of them
#: is taken as given, not fitted to the run
SCHEDULE_FIELDS = frozenset({"schedule", "warmup_steps", "total_steps", "min_lr_ratio"})


class RunRecipe(BaseModel):
    """A local optimizer whose schedule spans the run: a warm-up of ``warmup_fraction`` of a
    site's local steps, then ``schedule`` down to ``min_lr_ratio`` x lr at its last step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the optimizer, its lr (None: the workload's), decay, clipping and state; no schedule
    optimizer: LocalOptimizer
    schedule: ScheduleName = "cosine"
    warmup_fraction: float = Field(0.05, ge=0, lt=1, allow_inf_nan=False)
    min_lr_ratio: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)

    @model_validator(mode="after")
    def _no_schedule_in_steps(self) -> RunRecipe:
        o = self.optimizer
        if o.schedule != "constant" or o.warmup_steps or o.total_steps is not None:
            raise ValueError(
                "a run recipe's optimizer states no schedule in steps (its own spans the run), "
                f"got schedule {o.schedule!r}, warmup_steps {o.warmup_steps}, total_steps "
                f"{o.total_steps}"
            )
        return self

    @property
    def name(self) -> str:
        return self.optimizer.name

    def fit(self, site_steps: int, schedule: ScheduleName | None = None) -> LocalOptimizer:
        """This recipe for a run whose sites take at most ``site_steps`` local steps:
        ``round(warmup_fraction x site_steps)`` warm-up steps (at least one), then the schedule
        (``schedule`` overrides it) ending at ``site_steps``; a constant one has no end."""
        if site_steps < 1:
            raise ValueError(f"a run recipe needs >= 1 local step to fit, got {site_steps}")
        schedule = schedule or self.schedule
        warmup = max(1, round(self.warmup_fraction * site_steps)) if self.warmup_fraction else 0
        fields: dict[str, object] = {
            **self.optimizer.model_dump(exclude=set(SCHEDULE_FIELDS)),
            "warmup_steps": min(warmup, site_steps),
        }
        if schedule != "constant":
            fields.update(schedule=schedule, total_steps=site_steps, min_lr_ratio=self.min_lr_ratio)
        return LocalOptimizer.model_validate(fields)


class WorkloadDefaults(BaseModel):
    """One built-in workload's defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the learning rate of optimizers on SGD's scale (sgd, momentum, nesterov)
    lr: float = Field(gt=0)
    batch_size: int = Field(ge=1)
    #: the learning rate of adaptive optimizers (AdamW, Muon: the registry's ``adaptive_lr``);
    #: the SGD rates make them diverge
    adaptive_lr: float = Field(1e-3, gt=0)
    #: the local optimizer a run naming none trains with; None: plain SGD at ``lr``
    recipe: RunRecipe | None = None
    #: the only split the workload's samples have (None: any)
    partition: Partition | None = None


#: The LM's measured recipe (module docstring); the curtailment preset trains it too.
LM_RECIPE = RunRecipe(
    optimizer=LocalOptimizer(name="adamw", betas=(0.9, 0.99), weight_decay=0.1, clip_norm=1.0),
    schedule="cosine",
    warmup_fraction=0.05,  # 100 of the reference's 2,000 steps
    min_lr_ratio=0.05,  # 1e-4 at lr 2e-3
)

#: The paper's learning rates and batch sizes (0.01 for the CNNs, 0.8 for the LSTM, batch 20);
#: mnist1d uses 0.2: at 0.05 the CNN reaches ~0.75 in 150 rounds, at 0.2 0.93-0.95 in ~40.
WORKLOAD_DEFAULTS: Mapping[str, WorkloadDefaults] = {
    "mnist1d": WorkloadDefaults(lr=0.2, batch_size=20),
    "mnist": WorkloadDefaults(lr=0.01, batch_size=20),
    "emnist": WorkloadDefaults(lr=0.01, batch_size=20),
    "shakespeare": WorkloadDefaults(lr=0.8, batch_size=20),
    # a token stream has no labels or groups to split by; lr 0.1 is plain SGD's (from 0.15 up
    # the tiny model stalls at the unigram loss)
    "lm": WorkloadDefaults(
        lr=0.1, batch_size=12, adaptive_lr=2e-3, recipe=LM_RECIPE, partition="iid"
    ),
    # keyword transformer, plain SGD: centrally on FSDD 0.02 / 0.05 / 0.1 give 86 / 97 / 95 %
    # test accuracy after 4 epochs (docs/workloads.md)
    "speech-commands": WorkloadDefaults(lr=0.05, batch_size=20),
    "fsdd": WorkloadDefaults(lr=0.05, batch_size=20),
}


def workload_default(workload: str, key: Literal["lr", "batch_size"]) -> float:
    """A workload's default SGD learning rate or batch size: the table above for a built-in
    one, the ``CustomWorkload``'s own fields otherwise."""
    custom = resolve_workload(workload)
    return float(getattr(WORKLOAD_DEFAULTS[workload] if custom is None else custom, key))


def default_lr(workload: str, recipe: LocalOptimizer | RunRecipe | None) -> float:
    """The learning rate a run uses when it names none: a built-in workload's adaptive rate
    when ``recipe`` is an adaptive optimizer, otherwise the workload's (``workload_default``;
    ``recipe`` None is plain SGD)."""
    custom = resolve_workload(workload)
    if custom is not None:
        return float(custom.lr)
    defaults = WORKLOAD_DEFAULTS[workload]
    if recipe is not None and optimizer_entry(recipe.name).adaptive_lr:
        return defaults.adaptive_lr
    return defaults.lr


def layered_on(base: RunRecipe, given: LocalOptimizer) -> LocalOptimizer | RunRecipe:
    """``given`` over a workload's recipe ``base``, as a preset's recipe is layered
    (``presets.layered_recipe``): another optimizer starts from its own defaults; the fields
    ``given`` sets replace the base's; and the schedule still spans the run unless ``given``
    states one in steps (``SCHEDULE_FIELDS``), which is then taken as given."""
    layered = layered_recipe(base.optimizer, given)
    another = given.name != base.name and "name" in given.model_fields_set
    if another or SCHEDULE_FIELDS & given.model_fields_set:
        return layered
    return base.model_copy(update={"optimizer": layered})


def check_partition(workload: str | None, partition: str | None, setting: str) -> None:
    """The one rule on a workload's split: one with a single split (the LM: iid) takes no
    other. ``setting`` is how the error tells the fix: ``"--partition "`` or
    ``"POWERTRIP_PARTITION="``, followed by the split."""
    defaults = WORKLOAD_DEFAULTS.get(workload or "")
    only = None if defaults is None else defaults.partition
    if only is not None and partition not in (None, only):
        raise ValueError(
            f"the {workload} workload has no labels or groups to split by: {setting}{only}"
        )


def either_recipe(v: object) -> object:
    """A recipe in steps or one spanning the run, told apart by its ``optimizer`` key (so a
    bad one's errors name its own fields, not both models')."""
    if isinstance(v, dict):
        return (RunRecipe if "optimizer" in v else LocalOptimizer).model_validate(v)
    return v


def with_workload_defaults(
    values: dict[str, object], overrides: Mapping[str, object]
) -> dict[str, object]:
    """A built-in workload's defaults under a preset's values and the caller's: its only
    split unless the caller names one (a preset's label skew does not apply to a token
    stream), and a local optimizer recipe given over its own is layered on it (``layered_on``:
    ``--weight-decay 0`` keeps the LM's AdamW and its schedule)."""
    defaults = WORKLOAD_DEFAULTS.get(str(values.get("workload", "mnist1d")))
    if defaults is None:
        return values
    out = dict(values)
    if defaults.partition is not None and overrides.get("partition") is None:
        out["partition"] = defaults.partition
    given = out.get("local_optimizer")
    if defaults.recipe is not None and given is not None and not _is_run_recipe(given):
        out["local_optimizer"] = layered_on(defaults.recipe, LocalOptimizer.model_validate(given))
    return out


def _is_run_recipe(recipe: object) -> bool:
    return isinstance(recipe, RunRecipe) or (isinstance(recipe, dict) and "optimizer" in recipe)
