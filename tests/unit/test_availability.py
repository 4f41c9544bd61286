"""Site availability from carbon traces (the curtailment paper's rule): provisioned when curtailment
starts, ready after the provisioning delay, removed after the hysteresis; and the logged run's event
table reproduced from the paper's own trace."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from powertrip.curtailment.availability import (
    AvailabilityRule,
    Episode,
    SiteAvailability,
    always_available,
    availability_events,
    availability_from_trace,
    connected_at,
    episodes_from_windows,
)
from powertrip.traces.carbon import CarbonTrace, read_carbon_trace
from tests.needs import real_data_reason

PAPER_SITES = [("CAISO_NORTH", "CAISO_NORTH"), ("SPP_TX", "SPP_TX"), ("NEM_SA", "NEM_SA")]
TRACE_STEP_S = 300.0


def paper_trace(shared_data: Path) -> CarbonTrace:
    f = shared_data / "carbon" / "curtail-llm_mci_2026-01-11.csv"
    if not f.is_file():
        pytest.skip(real_data_reason("curtail-llm-mci"))
    return read_carbon_trace(f)


def first(events, site: str, kind: str, after: float = 0.0) -> float:
    return next(e.time_s for e in events if e.site == site and e.kind == kind and e.time_s > after)


def test_paper_trace_availability_matches_the_logged_event_table(shared_data):
    # The logged run, t in s from 17:00 UTC. The log adds polling and start-up jitter, so each event
    # must match within one trace step (300 s).
    sites = availability_from_trace(paper_trace(shared_data), PAPER_SITES)  # θ 100, 600 s, 240 s

    ev = availability_events(sites)

    ca_down = first(ev, "CAISO_NORTH", "deprovisioned")
    logged = {
        "CA curtailed: provisioned": (287, first(ev, "CAISO_NORTH", "provisioned")),
        "CA trains alone": (527, first(ev, "CAISO_NORTH", "ready")),
        "CA's MCI rises above θ": (7490, ca_down - 600),
        "CA deprovisioned after the hysteresis": (8125, ca_down),
        "CA curtailed again": (8391, first(ev, "CAISO_NORTH", "provisioned", after=ca_down)),
        "SA joins": (17_025, first(ev, "NEM_SA", "ready")),
        "CA leaves": (23_750, first(ev, "CAISO_NORTH", "deprovisioned", after=ca_down)),
        "TX joins": (36_527, first(ev, "SPP_TX", "ready")),
    }
    for event, (paper_s, ours_s) in logged.items():
        assert abs(ours_s - paper_s) <= TRACE_STEP_S, f"{event}: {ours_s} s vs logged {paper_s} s"


def test_paper_trace_never_has_more_than_two_sites_connected(shared_data):
    # The logged run's local provisioner could host two sites; the trace never asked for more.
    sites = availability_from_trace(paper_trace(shared_data), PAPER_SITES)

    counts = [len(connected_at(sites, t)) for t in np.arange(0, 18 * 3600, 60.0)]

    assert max(counts) == 2


def test_a_site_is_ready_only_after_the_provisioning_delay():
    (e,) = episodes_from_windows([(1000.0, 5000.0)], provisioning_s=240.0)
    site = SiteAvailability("a", "r", (e,))

    assert e == Episode(1000.0, 1240.0, 5000.0)
    assert not site.ready_at(1239.0) and site.ready_at(1240.0)
    assert site.ready_at(4999.0) and not site.ready_at(5000.0)


def test_a_window_shorter_than_the_delay_never_becomes_ready_but_is_listed():
    (e,) = episodes_from_windows([(0.0, 200.0)], provisioning_s=240.0)
    site = SiteAvailability("a", "r", (e,))

    assert not e.usable
    assert not any(site.ready_at(t) for t in (0.0, 199.0, 240.0))
    assert site.next_ready_after(0.0) is None
    assert [ev.kind for ev in availability_events([site])] == ["provisioned", "deprovisioned"]


def test_next_ready_is_the_next_usable_episode_start():
    site = SiteAvailability(
        "a", "r", episodes_from_windows([(0, 100), (500, 600), (1000, 3000)], 240.0)
    )

    assert site.next_ready_after(0.0) == 1240.0


def test_hysteresis_and_delay_follow_the_rule():
    # Below θ for 10 min, above for 20: the window closes 600 s after the first sample above.
    trace = CarbonTrace(
        ("r",),
        paper_start(),
        np.arange(6) * 300.0,
        np.array([[50.0, 50.0, 150.0, 150.0, 150.0, 150.0]]),
        300.0,
        "test",
        "hand-made",
    )

    (site,) = availability_from_trace(trace, [("a", "r")], AvailabilityRule(100, 600, 60))

    assert site.episodes == (Episode(0.0, 60.0, 1200.0),)


def test_regions_missing_from_the_trace_are_named():
    trace = CarbonTrace(
        ("r",), paper_start(), np.zeros(1), np.zeros((1, 1)), 300.0, "test", "hand-made"
    )

    with pytest.raises(ValueError, match="NOPE"):
        availability_from_trace(trace, [("a", "NOPE")])


def test_always_on_sites_are_ready_from_the_start_and_never_leave():
    sites = always_available([("a", "r"), ("b", "s")])

    assert connected_at(sites, 0.0) == [0, 1]
    assert sites[0].episode_at(1e9).end_s == math.inf


def paper_start():
    from datetime import UTC, datetime

    return datetime(2026, 1, 11, 17, tzinfo=UTC)
