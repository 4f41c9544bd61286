"""What the profiler knows about the grid: each site's region, its carbon intensity now, and
its availability episodes (the curtailment paper's provisioning rule), built by the curtailment
study's own code so that the service and ``powertrip curtail`` see the same sites, regions and
windows."""

from __future__ import annotations

from dataclasses import dataclass

from powertrip.config.curtailment import CurtailmentConfig
from powertrip.curtailment.availability import (
    AvailabilityRule,
    SiteAvailability,
    availability_from_trace,
)
from powertrip.curtailment.sites import build_sites, load_carbon
from powertrip.sites.profiles import site_id
from powertrip.traces.carbon import CarbonTrace


@dataclass(frozen=True)
class CarbonFeed:
    config: CurtailmentConfig
    trace: CarbonTrace
    rule: AvailabilityRule
    availability: tuple[SiteAvailability, ...]  # one per curtailment site, ids site-000, ...

    @classmethod
    def build(cls, cfg: CurtailmentConfig) -> CarbonFeed:
        trace = load_carbon(cfg)
        sites = build_sites(cfg, trace)
        rule = AvailabilityRule(cfg.threshold, cfg.hold_s, cfg.provisioning_s)
        pairs = [(site_id(i), s.region) for i, s in enumerate(sites)]
        return cls(cfg, trace, rule, tuple(availability_from_trace(trace, pairs, rule)))

    def region_of(self, site: int) -> str:
        """The study's region of a site; a catalogue larger than the curtailment federation
        wraps around (site i gets the region of curtailment site i mod n)."""
        return self.availability[site % len(self.availability)].region

    def intensity_of(self, site: int, t_s: float) -> float:
        now = self.trace.intensity_at(t_s)
        return float(now[self.trace.regions.index(self.region_of(site))])
