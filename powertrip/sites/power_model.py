"""Which power every site has over time: one builder for the emulator and the profiler service.

Both call ``build_power`` with their own configuration (``ExperimentConfig`` or
``ProfilerConfig``: anything with the four fields of ``PowerSettings``) and the site set they
generated from the same seed, so a profiler configured like a study serves exactly the power the
study's emulator sees at every instant.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from powertrip.config.sites import PowerModel
from powertrip.sites.profiles import PowerSource, SiteSet, StaticPower
from powertrip.traces.io import TraceError
from powertrip.traces.power import TracePower, read_power_trace
from powertrip.traces.synthetic import synthetic_power_trace

UNIFORM_LABEL = "uniform U(0.1, 1)"


class PowerSettings(Protocol):
    @property
    def power_model(self) -> PowerModel: ...
    @property
    def power_trace_path(self) -> Path | None: ...
    @property
    def site_seed(self) -> int: ...
    @property
    def num_sites(self) -> int: ...


def build_power(
    cfg: PowerSettings,
    sites: SiteSet,
    on_bad_file: Callable[[TraceError], None] | None = None,
) -> tuple[PowerSource, str]:
    """The PowerSource and its label ("uniform U(0.1, 1)", "synthetic-trace" or
    "google-trace (<column>, <n> domains)"). Trace offsets come from the site seed, so every
    policy, repeat and service sees the same power over time. ``on_bad_file``: see
    ``read_power_trace`` (the profiler keeps the good files of a trace folder)."""
    if cfg.power_model == "uniform":
        return StaticPower(sites.base_power), UNIFORM_LABEL
    if cfg.power_model == "synthetic-trace":
        trace = synthetic_power_trace(seed=cfg.site_seed)
        label = trace.label
    else:
        if cfg.power_trace_path is None:
            raise ValueError("the google-trace power model needs a trace path")
        trace = read_power_trace(cfg.power_trace_path, on_bad_file=on_bad_file)
        label = f"{trace.label} ({trace.column}, {len(trace.series)} domains)"
    return TracePower(trace, cfg.num_sites, np.random.default_rng([cfg.site_seed, 1])), label
