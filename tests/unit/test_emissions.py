"""Energy and emissions accounting (the curtailment paper's notebook): two power levels, linear
interpolation of the intensity on a 60 s grid, and the curtailed-energy share."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from powertrip.config.footprint import IDLE_KW, TRAIN_KW
from powertrip.curtailment.emissions import SitePowerLog, account
from powertrip.traces.carbon import CarbonTrace


def trace(values: list[float], step_s: float = 300.0, region: str = "r") -> CarbonTrace:
    return CarbonTrace(
        (region,),
        datetime(2026, 1, 1, tzinfo=UTC),
        np.arange(len(values)) * step_s,
        np.asarray([values], dtype=float),
        step_s,
        "test",
        "hand-made",
    )


def test_constant_intensity_gives_energy_times_intensity():
    log = SitePowerLog("a", "r", on=[(0.0, 7200.0)], training=[(0.0, 3600.0)])

    e = account([log], trace([200.0, 200.0]))

    assert e.train_kwh == pytest.approx(TRAIN_KW)
    assert e.idle_kwh == pytest.approx(IDLE_KW)
    assert e.emissions_kg == pytest.approx((TRAIN_KW + IDLE_KW) * 200.0 / 1000.0)
    assert e.training_site_hours == pytest.approx(1.0)
    assert e.cumulative_kg[-1] == pytest.approx(e.emissions_kg)


def test_a_deprovisioned_site_draws_nothing():
    log = SitePowerLog("a", "r", on=[(0.0, 600.0), (3000.0, 3600.0)])

    e = account([log], trace([100.0] * 13))

    assert e.energy_kwh == pytest.approx(IDLE_KW * 1200.0 / 3600.0)


def test_intensity_is_interpolated_linearly_between_samples():
    # 0 -> 600 g/kWh over one 300 s step: the mean over the step is ~300 on a fine grid.
    log = SitePowerLog("a", "r", training=[(0.0, 300.0)], on=[(0.0, 300.0)])

    e = account([log], trace([0.0, 600.0]), grid_s=1.0)

    assert e.emissions_kg == pytest.approx(TRAIN_KW * 300 / 3600 * 300 / 1000, rel=0.01)


def test_curtailed_share_is_the_energy_drawn_below_the_threshold():
    # 50 g/kWh for the first hour, 400 for the second, training throughout. Interpolated, the
    # intensity ramps 50 -> 400 between the samples at 3300 s and 3600 s and crosses 100 at
    # 3300 + 300 * 50/350 s: the share is that over 7200 s, to one 60 s grid step.
    values = [50.0] * 12 + [400.0] * 12
    log = SitePowerLog("a", "r", training=[(0.0, 7200.0)], on=[(0.0, 7200.0)])

    e = account([log], trace(values), threshold=100.0)

    crossing_s = 3300 + 300 * 50 / 350
    assert e.curtailed_share == pytest.approx(crossing_s / 7200, abs=60 / 7200)


def test_each_site_is_priced_at_its_own_region():
    both = CarbonTrace(
        ("clean", "dirty"),
        datetime(2026, 1, 1, tzinfo=UTC),
        np.array([0.0, 300.0]),
        np.array([[10.0, 10.0], [500.0, 500.0]]),
        300.0,
        "test",
        "hand-made",
    )
    logs = [
        SitePowerLog("a", "clean", training=[(0.0, 3600.0)], on=[(0.0, 3600.0)]),
        SitePowerLog("b", "dirty", training=[(0.0, 3600.0)], on=[(0.0, 3600.0)]),
    ]

    e = account(logs, both)

    assert e.emissions_kg == pytest.approx(TRAIN_KW * (10 + 500) / 1000)
    assert e.curtailed_share == pytest.approx(0.5)


def test_no_energy_means_no_share_rather_than_a_division_error():
    e = account([SitePowerLog("a", "r")], trace([50.0]))

    assert e.energy_kwh == 0 and e.curtailed_share == 0 and e.emissions_kg == 0
