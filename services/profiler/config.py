"""Profiler settings (POWERTRIP_* environment variables)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from powertrip.config.experiment import ExperimentConfig
from powertrip.config.sites import DistanceMode, PowerModel
from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.settings import CurtailSettings, library_field


class ProfilerConfig(ServiceConfig, CurtailSettings):
    # The site model: the same values as the aggregator's experiment, so both see one geography;
    # power over time built by the emulator's own builder (powertrip/sites/power_model.py).
    num_sites: int = library_field(ExperimentConfig, "num_sites", default=50)
    site_seed: int = library_field(ExperimentConfig, "site_seed", default=0)
    distance_mode: DistanceMode = library_field(
        ExperimentConfig, "distance_mode", default=DistanceMode.STRATIFIED
    )
    power_model: PowerModel = library_field(ExperimentConfig, "power_model", default="uniform")
    power_trace_path: Path | None = library_field(ExperimentConfig, "power_trace_path")
    probe_interval_s: float = Field(
        30.0, gt=0, description="periodic re-measurement of every worker's link"
    )
    ping_count: int = Field(7, ge=1, description="RTT = median of this many small round trips")
    probe_bytes: int = Field(4 << 20, ge=1 << 16, description="bulk bytes per bandwidth probe")
    probe_timeout_s: float = Field(60.0, gt=0, description="deadline of one bulk stream")
    smoothing: float = Field(0.5, gt=0, le=1, description="EWMA weight of a new measurement")
    probe_budget_bytes_per_hour: int = Field(
        1 << 30,
        ge=0,
        description="Cap on bulk probe bytes over any trailing hour, all workers together; a "
        "bandwidth probe that would exceed it is skipped (the RTT is still measured) and "
        'counted as "over_budget".',
    )

    @model_validator(mode="after")
    def _power_trace_matches_model(self) -> ProfilerConfig:
        if (self.power_model == "google-trace") != (self.power_trace_path is not None):
            raise ValueError(
                "POWERTRIP_POWER_MODEL=google-trace and POWERTRIP_POWER_TRACE_PATH go together"
            )
        if self.power_trace_path is not None and not self.power_trace_path.exists():
            raise ValueError(f"power trace {self.power_trace_path} does not exist")
        return self
