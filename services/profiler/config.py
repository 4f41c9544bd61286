"""Profiler settings (POWERTRIP_* environment variables)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from powertrip.services.common.config import CurtailSettings, ServiceConfig
from powertrip.sites import DistanceMode
from powertrip.traces.power_model import PowerModel


class ProfilerConfig(ServiceConfig, CurtailSettings):
    # The site model: the same values as the aggregator's experiment, so both see one geography.
    num_sites: int = Field(50, ge=1)
    site_seed: int = 0
    distance_mode: DistanceMode = DistanceMode.STRATIFIED
    # Power over time, built by the emulator's own builder (powertrip/traces/power_model.py).
    power_model: PowerModel = "uniform"
    power_trace_path: Path | None = None  # Google powerdata_2019 file or folder (google-trace)
    # Link probes.
    probe_interval_s: float = Field(30.0, gt=0)  # periodic re-measurement of every worker
    ping_count: int = Field(7, ge=1)  # RTT = median of this many small round trips
    probe_bytes: int = Field(4 << 20, ge=1 << 16)  # bulk bytes per bandwidth probe
    probe_timeout_s: float = Field(60.0, gt=0)  # deadline of one bulk stream
    smoothing: float = Field(0.5, gt=0, le=1)  # EWMA weight of a new measurement
    # Cap on bulk probe bytes over any trailing hour, all workers together; a bandwidth probe
    # that would exceed it is skipped (the RTT is still measured) and counted as "over_budget".
    probe_budget_bytes_per_hour: int = Field(1 << 30, ge=0)

    @model_validator(mode="after")
    def _power_trace_matches_model(self) -> ProfilerConfig:
        if (self.power_model == "google-trace") != (self.power_trace_path is not None):
            raise ValueError(
                "POWERTRIP_POWER_MODEL=google-trace and POWERTRIP_POWER_TRACE_PATH go together"
            )
        if self.power_trace_path is not None and not self.power_trace_path.exists():
            raise ValueError(f"power trace {self.power_trace_path} does not exist")
        return self
