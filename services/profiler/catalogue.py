"""What the profiler serves: every site's geography, its power now, and its measured link."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from powertrip.services.profiler import metrics
from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.profiler.links import LinkEstimate
from powertrip.sites.power_model import build_power
from powertrip.sites.profiles import PowerSource, SiteSet, generate_sites
from powertrip.traces.io import TraceError

logger = logging.getLogger(__name__)


def _skip_bad_trace_file(exc: TraceError) -> None:
    """One corrupt file of a trace folder costs its own series, not the profiler: one line naming
    file, line and column, and a counter an alert can watch."""
    logger.error("power trace file skipped: %s", exc)
    metrics.TRACE_FILES_REJECTED.inc()


@dataclass(frozen=True)
class SiteRow:
    index: int
    distance_mi: float
    power: float
    modelled_latency_s: float
    modelled_bandwidth_bytes_per_s: float
    rtt_s: float
    bandwidth_bytes_per_s: float
    measured_at_s: float


class SiteCatalogue:
    """The same site model and power over time that the emulator builds from the same seed and
    power model, plus live link estimates.

    ``power`` replaces the configured power model (tests, or a source fed from elsewhere); its
    label is ``power_label`` or, failing that, the source's own ``label`` attribute.
    """

    def __init__(
        self,
        cfg: ProfilerConfig,
        power: PowerSource | None = None,
        power_label: str | None = None,
    ) -> None:
        self.sites: SiteSet = generate_sites(
            cfg.num_sites, np.random.default_rng(cfg.site_seed), cfg.distance_mode
        )
        if power is None:
            self.power, self.power_label = build_power(cfg, self.sites, _skip_bad_trace_file)
        else:
            self.power = power
            label = power_label or getattr(power, "label", None)
            self.power_label = str(label) if label else "custom"

    def rows(self, t_s: float, links: dict[int, LinkEstimate]) -> list[SiteRow]:
        power = self.power.power_at(t_s)
        s = self.sites
        out = []
        for i in range(s.size):
            est = links.get(i)
            out.append(
                SiteRow(
                    index=i,
                    distance_mi=float(s.distance_mi[i]),
                    power=float(power[i]),
                    modelled_latency_s=float(s.latency_s[i]),
                    modelled_bandwidth_bytes_per_s=float(s.bandwidth_bps[i]) / 8,
                    rtt_s=est.rtt_s if est else 0.0,
                    bandwidth_bytes_per_s=est.bandwidth_bytes_per_s if est else 0.0,
                    measured_at_s=est.measured_at_s if est else 0.0,
                )
            )
        return out
