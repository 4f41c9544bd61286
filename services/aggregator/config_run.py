"""The aggregator's training run: a preset of ``powertrip.config.experiment`` plus overrides that
are the
library's ``ExperimentConfig`` fields under their own names (``POWERTRIP_NUM_SITES`` is
``num_sites``), so the service and ``powertrip experiment`` share one definition of each."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from powertrip.config.experiment import (
    AggregationRule,
    ExperimentConfig,
    ModelSize,
    Partition,
    build_config,
    needs_dataset_path,
)
from powertrip.config.forecast import ForecastModel
from powertrip.config.outer import OuterRule
from powertrip.config.recipe import LocalOptimizer
from powertrip.config.workload_defaults import check_partition
from powertrip.selection.registry import validate_policy_name
from powertrip.services.common.config import ConfigError, config_error
from powertrip.services.common.settings import env_name, library_field, library_fields


class RunSettings(BaseModel):
    """The PowerTrip run the aggregator drives (POWERTRIP_MODE=powertrip)."""

    preset: str = Field("quick", description="the experiment preset the overrides below apply to")
    policy: str = Field("powertrip", description="the one selection policy this run uses")
    k_star: int | None = Field(
        None, ge=1, description="static-optimal / random: the site count (the static sweep's k)"
    )
    num_sites: int | None = library_field(ExperimentConfig, "num_sites")
    num_samples: int | None = library_field(ExperimentConfig, "num_samples")
    workload: str | None = library_field(ExperimentConfig, "workload")
    dataset_path: Path | None = library_field(ExperimentConfig, "dataset_path")
    partition: Partition | None = library_field(ExperimentConfig, "partition")
    model_size: ModelSize | None = library_field(ExperimentConfig, "model_size")
    seed: int | None = library_field(ExperimentConfig, "seed")
    target_accuracy: float | None = library_field(ExperimentConfig, "target_accuracy")
    max_rounds: int | None = library_field(ExperimentConfig, "max_rounds")
    update_gb: float | None = library_field(ExperimentConfig, "update_gb")
    ideal_compute_s: float | None = library_field(ExperimentConfig, "ideal_compute_s")
    aggregation: AggregationRule | None = library_field(ExperimentConfig, "aggregation")
    clip_norm: float | None = library_field(ExperimentConfig, "clip_norm")
    trim_beta: float | None = library_field(ExperimentConfig, "trim_beta")
    outer: OuterRule | None = library_field(ExperimentConfig, "outer")
    outer_lr: float | None = library_field(ExperimentConfig, "outer_lr")
    outer_momentum: float | None = library_field(ExperimentConfig, "outer_momentum")
    local_optimizer: LocalOptimizer | None = library_field(ExperimentConfig, "local_optimizer")
    # the update codec the aggregator assigns every worker (docs/compression.md)
    codec: str | None = library_field(ExperimentConfig, "codec")
    error_feedback: bool | None = library_field(ExperimentConfig, "error_feedback")
    # the policy's forecast, over the power the profiler reports (docs/forecasts.md)
    forecast: ForecastModel | None = library_field(ExperimentConfig, "forecast")

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        validate_policy_name(v)
        return v

    @model_validator(mode="after")
    def _workload_has_its_data(self) -> RunSettings:
        # Checked on names only; that the path exists, by experiment() at the service's start
        # (so a deployment's config still validates on a machine without the volume).
        if needs_dataset_path(self.workload) and self.dataset_path is None:
            raise ValueError(
                f"POWERTRIP_WORKLOAD={self.workload} needs POWERTRIP_DATASET_PATH "
                "(datasets are mounted, never downloaded)"
            )
        if self.forecast == "oracle":
            raise ValueError(
                "POWERTRIP_FORECAST=oracle needs the true future power, which the aggregator "
                "does not have: persistence or ewma (fitted on the profiler's reports)"
            )
        check_partition(self.workload, self.partition, f"{env_name('partition')}=")
        return self

    def experiment(self) -> ExperimentConfig:
        """The run: the preset plus these overrides; ConfigError naming the variable when the
        dataset is missing here or the combination is invalid."""
        if self.dataset_path is not None and not self.dataset_path.exists():
            var = env_name("dataset_path")
            raise ConfigError(f"{var}={str(self.dataset_path)!r}: no such file or directory")
        try:
            return self._build()
        except ValidationError as exc:
            raise config_error(exc, {}) from None

    def _build(self) -> ExperimentConfig:
        # unset settings leave the preset's value, over the workload's (lm: iid sites)
        overrides = {n: getattr(self, n) for n in library_fields(type(self), ExperimentConfig)}
        return build_config(
            self.preset,
            **overrides,
            policies=(self.policy,),
            static_sweep=(self.k_star,) if self.k_star else None,
        )
