"""The curtailment federation's sites and carbon feed, shared by the study and the profiler
service (kept free of torch so the profiler starts light)."""

from __future__ import annotations

import numpy as np

from powertrip.config.curtailment import CurtailmentConfig
from powertrip.curtailment.run_model import ElasticSite
from powertrip.sites.profiles import generate_sites
from powertrip.sites.timing import comm_time_s
from powertrip.traces.carbon import CarbonTrace, read_carbon_trace, synthetic_carbon_trace

#: Embedded trace: the generator's levels lowered so that its three regions are curtailed for
#: about as long as the paper's (22 vs 24 site-hours below θ in 18 h, seed 1).
SYNTHETIC_BASE_RANGE = (120.0, 300.0)
SYNTHETIC_SEED = 1


def load_carbon(cfg: CurtailmentConfig) -> CarbonTrace:
    if cfg.carbon_trace_path is None:
        return synthetic_carbon_trace(
            hours=cfg.hours, seed=SYNTHETIC_SEED, base_range=SYNTHETIC_BASE_RANGE
        )
    return read_carbon_trace(cfg.carbon_trace_path)


def build_sites(cfg: CurtailmentConfig, trace: CarbonTrace) -> tuple[ElasticSite, ...]:
    """One site per region (or several), links from PowerTrip's distance model (Eq. 3,
    ``powertrip.sites.profiles``). A site at power fraction P draws idle + P·(train - idle) while
    training: a power cap idles GPUs (Eq. 6) but the node's idle draw remains."""
    regions = cfg.regions or trace.regions
    unknown = [r for r in regions if r not in trace.regions]
    if unknown:
        raise ValueError(
            f"--regions: {', '.join(unknown)} not in the carbon trace "
            f"(it has {', '.join(trace.regions)})"
        )
    n = len(regions) * cfg.sites_per_region
    power = cfg.site_power or (1.0,) * n
    if len(power) != n:
        raise ValueError(f"--site-power: {len(power)} value(s) for {n} site(s)")
    geo = generate_sites(n, np.random.default_rng(cfg.site_seed))
    comm = comm_time_s(geo.latency_s, geo.bandwidth_bps, cfg.update_gb * 1e9)
    sites = []
    for k in range(n):
        region = regions[k // cfg.sites_per_region]
        name = region if cfg.sites_per_region == 1 else f"{region}-{k % cfg.sites_per_region}"
        sites.append(
            ElasticSite(
                name,
                region,
                float(power[k]),
                float(comm[k]),
                float(geo.distance_mi[k]),
                cfg.idle_kw + float(power[k]) * (cfg.train_kw - cfg.idle_kw),
                cfg.idle_kw,
            )
        )
    return tuple(sites)
