"""The aggregator's training run: a preset of ``powertrip.config.experiment`` plus overrides that
are the library's ``ExperimentConfig`` fields under their own names (``POWERTRIP_NUM_SITES`` is
``num_sites``), so the service and ``powertrip experiment`` share one definition of each.

Every field is a variable but those in ``RUN_LESS`` (each with the reason): derived from the
model (``library_settings``), so a new field is a variable the moment it is declared. The few
this package's code reads by name are declared with the type it reads (``library_field``: the
description, constraints and validators are still the library's, and a test holds the types
equal).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from powertrip.config.experiment import (
    ExperimentConfig,
    Partition,
    build_config,
    needs_dataset_path,
)
from powertrip.config.forecast import ForecastModel
from powertrip.config.workload_defaults import check_partition
from powertrip.services.common.config import ConfigError, config_error
from powertrip.services.common.settings import (
    env_name,
    library_field,
    library_settings,
    library_values,
)

#: ``ExperimentConfig`` fields no aggregator variable sets, and why.
RUN_LESS = {
    "name": "the preset's name (POWERTRIP_PRESET)",
    "description": "the preset's description",
    "policies": "POWERTRIP_POLICY: a service run trains one policy",
    "static_sweep": "POWERTRIP_K_STAR: the one k of static-optimal or random",
    "repeats": "a service run is one seed (POWERTRIP_SEED)",
    "tokenizer_sha256": "filled in by the aggregator for its workers",
    "distance_mode": "the profiler's: it measures each worker's link",
    "power_model": "the profiler's: it reports the sites' power",
    "power_trace_path": "the profiler's: it reports the sites' power",
    "site_seed": "the profiler's: the sites' modelled distances",
    "hostile_fraction": "the emulator's simulated poisoning; a service run's are real workers",
    "hostile_attack": "the emulator's simulated poisoning",
    "hostile_scale": "the emulator's simulated poisoning",
    "forecast_error": "the oracle forecast's, which the aggregator cannot have",
}

#: read by name in this package (the run's size and target, the checks below): typed
TYPED = ("num_sites", "target_accuracy", "workload", "dataset_path", "partition", "forecast")
DERIVED = [n for n in ExperimentConfig.model_fields if n not in RUN_LESS and n not in TYPED]

if TYPE_CHECKING:  # derived at run time; this package reads none of them by name
    _RunFields = BaseModel
else:
    _RunFields = library_settings(ExperimentConfig, DERIVED, __name__)


class RunSettings(_RunFields):
    """The PowerTrip run the aggregator drives (POWERTRIP_MODE=powertrip); the fields the
    curtailment run shares with it (the workload, its optimizer, ...) apply to that too."""

    preset: str = Field("quick", description="the experiment preset the overrides below apply to")
    policy: str = Field("powertrip", description="the one selection policy this run uses")
    k_star: int | None = Field(
        None, ge=1, description="static-optimal / random: the site count (the static sweep's k)"
    )
    num_sites: int | None = library_field(ExperimentConfig, "num_sites")
    target_accuracy: float | None = library_field(ExperimentConfig, "target_accuracy")
    workload: str | None = library_field(ExperimentConfig, "workload")
    dataset_path: Path | None = library_field(ExperimentConfig, "dataset_path")
    partition: Partition | None = library_field(ExperimentConfig, "partition")
    # the policy's forecast, over the power the profiler reports (docs/forecasts.md)
    forecast: ForecastModel | None = library_field(ExperimentConfig, "forecast")

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        from powertrip.selection.registry import validate_policy_name  # numpy: not for --help

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
            return self.build_experiment()
        except ValidationError as exc:
            raise config_error(exc, {}) from None

    def build_experiment(self) -> ExperimentConfig:
        """The run, or the library's ValidationError (``experiment`` names the variables)."""
        # unset settings leave the preset's value, over the workload's (lm: iid sites)
        overrides = library_values(self, ExperimentConfig)
        return build_config(
            self.preset,
            **overrides,
            policies=(self.policy,),
            static_sweep=(self.k_star,) if self.k_star else None,
        )
