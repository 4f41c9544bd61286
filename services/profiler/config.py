"""Profiler settings (POWERTRIP_* environment variables)."""

from __future__ import annotations

from pydantic import Field

from services.common.config import ServiceConfig
from services.common.sites import DistanceMode


class ProfilerConfig(ServiceConfig):
    # The site model: the same values as the aggregator's experiment, so both see one geography.
    num_sites: int = Field(50, ge=1)
    site_seed: int = 0
    distance_mode: DistanceMode = DistanceMode.STRATIFIED
    probe_interval_s: float = Field(30.0, gt=0)  # periodic re-measurement of every worker
    ping_count: int = Field(7, ge=1)  # RTT = median of this many small round trips
    probe_bytes: int = Field(4 << 20, ge=1 << 16)  # bulk bytes per bandwidth probe
    smoothing: float = Field(0.5, gt=0, le=1)  # EWMA weight of a new measurement
