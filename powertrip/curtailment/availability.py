"""Which sites may train when: availability from carbon traces, as in the curtailment paper
(arXiv 2602.22760).

A site's curtailment window (``powertrip.traces.carbon.curtailment_windows``: enter while the
marginal intensity is below θ, leave after it stayed above θ for the hold time) becomes one
provisioning episode: the node is requested when the window opens and draws idle power while it
is brought up; it can join a round once the provisioning delay has passed, and it is removed when
the window closes. A window shorter than the delay costs idle power and never trains.

Pure and clock-free, so the emulator and (later) the aggregator service read the same episodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from powertrip.config.carbon import HOLD_S, PROVISIONING_S, THRESHOLD
from powertrip.traces.carbon import CarbonTrace, curtailment_windows


@dataclass(frozen=True)
class AvailabilityRule:
    threshold: float = THRESHOLD  # gCO2/kWh (as the paper's notebook reads it), curtailed below
    hold_s: float = HOLD_S  # exit hysteresis
    provisioning_s: float = PROVISIONING_S

    def __post_init__(self) -> None:
        if self.hold_s < 0 or self.provisioning_s < 0:
            raise ValueError("hold and provisioning times must be >= 0 s")


@dataclass(frozen=True)
class Episode:
    """One provisioning of a site: [provisioned, end) powered, [ready, end) able to train."""

    provisioned_s: float
    ready_s: float
    end_s: float

    @property
    def usable(self) -> bool:
        return self.ready_s < self.end_s


@dataclass(frozen=True)
class SiteAvailability:
    site: str
    region: str
    episodes: tuple[Episode, ...]

    def episode_at(self, t: float) -> Episode | None:
        """The episode in which the site is ready (connected) at t, if any."""
        for e in self.episodes:
            if e.ready_s <= t < e.end_s:
                return e
        return None

    def ready_at(self, t: float) -> bool:
        return self.episode_at(t) is not None

    def next_ready_after(self, t: float) -> float | None:
        later = [e.ready_s for e in self.episodes if e.usable and e.ready_s > t]
        return min(later, default=None)


def episodes_from_windows(
    windows: Sequence[tuple[float, float]], provisioning_s: float
) -> tuple[Episode, ...]:
    return tuple(Episode(a, a + provisioning_s, b) for a, b in windows)


def availability_from_trace(
    trace: CarbonTrace,
    sites: Sequence[tuple[str, str]],
    rule: AvailabilityRule | None = None,
) -> list[SiteAvailability]:
    """Episodes of every (site, region) pair; several sites may share a region's windows."""
    rule = rule or AvailabilityRule()
    unknown = sorted({r for _, r in sites} - set(trace.regions))
    if unknown:
        raise ValueError(
            f"region(s) {', '.join(unknown)} not in the carbon trace "
            f"(it has {', '.join(trace.regions)})"
        )
    windows = curtailment_windows(trace, rule.threshold, rule.hold_s)
    return [
        SiteAvailability(s, r, episodes_from_windows(windows[r], rule.provisioning_s))
        for s, r in sites
    ]


def always_available(sites: Sequence[tuple[str, str]]) -> list[SiteAvailability]:
    """The always-on baselines: ready from t = 0, never removed (the run's end stops them)."""
    return [SiteAvailability(s, r, (Episode(0.0, 0.0, math.inf),)) for s, r in sites]


@dataclass(frozen=True)
class AvailabilityEvent:
    time_s: float
    site: str
    kind: str  # "provisioned", "ready", "deprovisioned"


def availability_events(
    sites: Sequence[SiteAvailability], until_s: float = math.inf
) -> list[AvailabilityEvent]:
    """A run's timeline (provisioned, ready, deprovisioned), in time order (ties: site order)."""
    out: list[AvailabilityEvent] = []
    for s in sites:
        for e in s.episodes:
            out.append(AvailabilityEvent(e.provisioned_s, s.site, "provisioned"))
            if e.usable:
                out.append(AvailabilityEvent(e.ready_s, s.site, "ready"))
            out.append(AvailabilityEvent(e.end_s, s.site, "deprovisioned"))
    return sorted((ev for ev in out if ev.time_s < until_s), key=lambda ev: ev.time_s)


def connected_at(sites: Sequence[SiteAvailability], t: float) -> list[int]:
    """Indices of the sites ready at t: n = 0 pause, 1 solo, >= 2 federated (the paper's modes)."""
    return [i for i, s in enumerate(sites) if s.ready_at(t)]


def change_times(sites: Sequence[SiteAvailability], after_s: float) -> list[float]:
    """Every moment after ``after_s`` at which the connected set can change."""
    times = {e.ready_s for s in sites for e in s.episodes if e.usable}
    times |= {e.end_s for s in sites for e in s.episodes if e.usable}
    return sorted(t for t in times if after_s < t < math.inf)
