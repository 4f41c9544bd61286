"""Experiment configuration: one validated, frozen object per study, from a preset + overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from powertrip.config.aggregation import check_settings, check_trim_beta
from powertrip.config.codecs import CodecSettings
from powertrip.config.fields import omitted_at_default
from powertrip.config.footprint import FootprintSettings
from powertrip.config.forecast import ForecastSettings
from powertrip.config.greedy import GreedyParams as GreedyParams
from powertrip.config.hostile import HostileSettings
from powertrip.config.outer import OuterSettings
from powertrip.config.presets import ALL_POLICIES as ALL_POLICIES
from powertrip.config.presets import PRESETS, default_sweep, preset_values
from powertrip.config.recipe import LocalOptimizer
from powertrip.config.sites import DistanceMode, PowerModel, RoundTimeModel
from powertrip.config.tokenizer import TokenizerSettings
from powertrip.config.workload_defaults import WORKLOAD_DEFAULTS as WORKLOAD_DEFAULTS
from powertrip.config.workload_defaults import Partition as Partition
from powertrip.config.workload_defaults import (
    RunRecipe,
    check_partition,
    either_recipe,
    with_workload_defaults,
)
from powertrip.config.workload_defaults import default_lr as default_lr
from powertrip.config.workload_defaults import workload_default as workload_default
from powertrip.config.workloads import needs_dataset_path as needs_dataset_path
from powertrip.config.workloads import validate_workload


def _target_in_unit_interval(v: float | None) -> float | None:
    if v is not None and not 0 < v <= 1:
        raise ValueError(f"target accuracy must be in (0, 1], got {v}")
    return v


#: an accuracy to reach, in (0, 1]; None where a rule picks it after the fact
TargetAccuracy = Annotated[float | None, AfterValidator(_target_in_unit_interval)]

ModelSize = Literal["tiny", "small", "medium", "large", "xl"]
#: powertrip.aggregation.robust.RULES
AggregationRule = Literal["robust", "fedavg", "trimmed-mean", "median"]
TrimBeta = Annotated[float | None, AfterValidator(check_trim_beta)]


class RunConfig(BaseModel):
    """What both study modes share: a name, and the workload with its data. The PowerTrip study
    (``ExperimentConfig``) and the curtailment study (``CurtailmentConfig``) extend it, and
    ``preset_values`` merges a preset and overrides for either."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("custom", description="The study's name (its preset's, if any).")
    description: str = Field("", description="What the study is, in a sentence.")
    workload: Annotated[str, AfterValidator(validate_workload)] = Field(
        "mnist1d",
        description="A built-in workload, or MODULE:ATTR naming your powertrip.CustomWorkload.",
    )
    dataset_path: Path | None = Field(
        None,
        description="IDX folder (mnist/emnist), Shakespeare text(s), a Speech Commands or FSDD "
        "folder, or for lm a text file or a .npy of token ids (lm without it: an embedded "
        "synthetic corpus).",
    )
    # the LM's size (learning/gpt.py: GPT_SIZES, default tiny) and overrides of its fields;
    # left out of dumps while unset, so other workloads' summaries do not change
    model_size: ModelSize | None = omitted_at_default(
        None, "LM size (default tiny, ~1 M parameters; xl ~570 M needs a GPU)."
    )
    n_layer: int | None = omitted_at_default(None, "LM: transformer blocks.", ge=1)
    n_head: int | None = omitted_at_default(None, "LM: attention heads.", ge=1)
    d_model: int | None = omitted_at_default(None, "LM: embedding width.", ge=1)
    context_length: int | None = omitted_at_default(None, "LM: tokens per window.", ge=1)

    @model_validator(mode="after")
    def _dataset_given(self) -> Self:
        if needs_dataset_path(self.workload) and self.dataset_path is None:
            raise ValueError(f"workload {self.workload!r} needs --dataset-path (no download here)")
        if self.dataset_path is not None and not self.dataset_path.exists():
            raise ValueError(f"dataset path {self.dataset_path} does not exist")
        return self


class ExperimentConfig(
    OuterSettings,
    TokenizerSettings,
    ForecastSettings,
    CodecSettings,
    FootprintSettings,
    HostileSettings,
    RunConfig,
):
    """The PowerTrip study: sites, power, network, policies, protocol; the rest from the mixins."""

    local_optimizer: Annotated[
        LocalOptimizer | RunRecipe | None, BeforeValidator(either_recipe)
    ] = omitted_at_default(
        None,
        'Each site\'s local optimizer: a recipe, e.g. {"name": "adamw", '
        '"lr": 0.001}, or one whose schedule spans the run (RunRecipe). Unset: the workload\'s '
        "(lm: the measured AdamW recipe, powertrip.config.workload_defaults; others: plain SGD).",
    )

    num_samples: int = Field(
        20_000, ge=100, description="Samples to generate (mnist1d) or keep (shakespeare)."
    )
    partition: Partition = Field("iid", description="How the samples are split among the sites.")
    dirichlet_alpha: float = Field(0.3, gt=0, description="dirichlet: label-skew concentration.")
    lr: float | None = Field(
        None,
        gt=0,
        description="Local learning rate (default: the workload's, for its optimizer: lm's "
        "AdamW 2e-3, the others' SGD rates).",
    )
    batch_size: int | None = Field(None, ge=1, description="Local batch (default: the workload's).")
    local_epochs: int = Field(1, ge=1, description="Local epochs per round.")
    max_local_steps: int | None = Field(
        None, ge=1, description="Cap on local SGD steps per round (default: one local epoch)."
    )
    num_sites: int = Field(100, ge=1, description="Number of emulated sites.")
    distance_mode: DistanceMode = Field(
        DistanceMode.STRATIFIED, description="How the sites' distances are drawn."
    )
    update_gb: float = Field(1.5, ge=0, description="Model update size in decimal GB.")
    power_model: PowerModel = Field(
        "uniform",
        description="Site power: static U(0.1, 1), the embedded synthetic trace, or Google "
        "powerdata_2019 files (google-trace, with the power trace path).",
    )
    power_trace_path: Path | None = Field(
        None, description="Google powerdata_2019 file or folder (power model google-trace)."
    )
    ideal_compute_s: float = Field(
        50.0, gt=0, description="Emulated local-training time per round at 100% power (s)."
    )
    ground_truth: RoundTimeModel = Field(
        RoundTimeModel.PER_SITE_MAX,
        description="Round-time model: per-site max (the paper's §5.1 emulation) or Eq. 7 "
        "aggregate.",
    )
    round_trip: bool = Field(False, description="Also count the broadcast leg (Eq. 3: one way).")
    policies: tuple[str, ...] = Field(
        ("powertrip", "static-optimal", "centralized-25"), description="Policy names."
    )
    static_sweep: tuple[int, ...] = Field(
        default_factory=default_sweep, description="Static-k sweep (default: 10%..100% of sites)."
    )
    repeats: int = Field(1, ge=1, description="Training seeds per policy.")
    seed: int = Field(0, description="First training seed.")
    site_seed: int = Field(0, description="Seed of the site profiles (fixed across repeats).")
    target_accuracy: TargetAccuracy = Field(
        None,
        description="Target accuracy in (0, 1]; None (CLI: auto): the paper's rule, the lowest "
        "best accuracy any static-k run reaches within the round budget (docs/reproduction.md).",
    )
    max_rounds: int = Field(120, ge=1, description="Round budget per run.")
    greedy: GreedyParams = Field(GreedyParams(), description="Algorithm 1's free parameters.")
    # aggregation (powertrip/aggregation/robust.py, docs/robust-aggregation.md); left out of dumps
    # while
    # at the default / unset
    aggregation: AggregationRule = omitted_at_default(
        "robust",
        "Aggregation rule: robust (default: FedAvg that drops extreme updates and "
        "clips the rest to an adaptive norm, TFF's robust_aggregator), fedavg (the paper's plain "
        "mean), trimmed-mean or median (hold every update; docs/robust-aggregation.md).",
    )
    clip_norm: float | None = omitted_at_default(
        None, "Robust rules: clip each update's L2 norm.", gt=0, allow_inf_nan=False
    )
    trim_beta: TrimBeta = omitted_at_default(
        None,
        "trimmed-mean: fraction cut at each end per coordinate, in [0, 0.5); 0.2.",
        allow_inf_nan=False,
    )

    @field_validator("policies")
    @classmethod
    def _known_policies(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("at least one policy is required")
        return tuple(dict.fromkeys(v))

    @field_validator("static_sweep")
    @classmethod
    def _positive_sweep(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(k < 1 for k in v):
            raise ValueError("static sweep values must be >= 1")
        return tuple(sorted(set(v)))

    @model_validator(mode="before")
    @classmethod
    def _workload_recipe(cls, data: object) -> object:
        """Unset, the local optimizer is the workload's own (so the summary shows it)."""
        if isinstance(data, dict) and data.get("local_optimizer") is None:
            defaults = WORKLOAD_DEFAULTS.get(str(data.get("workload", "mnist1d")))
            if defaults is not None and defaults.recipe is not None:
                return {**data, "local_optimizer": defaults.recipe}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ExperimentConfig:
        if (self.power_model == "google-trace") != (self.power_trace_path is not None):
            raise ValueError("--power-model google-trace and --power-trace go together")
        if self.power_trace_path is not None and not self.power_trace_path.exists():
            raise ValueError(f"--power-trace {self.power_trace_path} does not exist")
        check_partition(self.workload, self.partition, "--partition ")
        if self.target_accuracy is None and not self.static_sweep:
            raise ValueError("the automatic target needs a static sweep; give --target")
        needs_sweep = {"static-optimal", "random"} & set(self.policies)
        if needs_sweep and not self.static_sweep:
            raise ValueError(f"{sorted(needs_sweep)} need a static sweep (static_sweep is empty)")
        check_settings(self.aggregation, self.clip_norm, self.trim_beta)
        return self

    @property
    def effective_sweep(self) -> tuple[int, ...]:
        return tuple(k for k in self.static_sweep if k <= self.num_sites)

    def run_recipe(self, site_steps: int) -> LocalOptimizer | None:
        """The local optimizer of a run whose sites take at most ``site_steps`` local steps:
        a recipe whose schedule spans the run fitted to them, any other as given (None: plain
        SGD at ``learning_rate``)."""
        recipe = self.local_optimizer
        return recipe.fit(site_steps) if isinstance(recipe, RunRecipe) else recipe

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else default_lr(self.workload, self.local_optimizer)

    @property
    def local_batch_size(self) -> int:
        return int(self.batch_size or workload_default(self.workload, "batch_size"))

    @property
    def update_bytes(self) -> float:
        return self.update_gb * 1e9


def build_config(preset: str | None = None, **overrides: object) -> ExperimentConfig:
    """A study from a preset (``PRESETS``) and overrides, over the workload's defaults
    (``with_workload_defaults``). A power trace file implies its power model;
    ``target_accuracy="auto"``: the paper's rule, decided after the static sweep."""
    values = with_workload_defaults(preset_values(PRESETS, preset, overrides), overrides)
    if overrides.get("power_trace_path") is not None and overrides.get("power_model") is None:
        values["power_model"] = "google-trace"
    if values.get("target_accuracy") == "auto":
        values["target_accuracy"] = None
    return ExperimentConfig(**values)
