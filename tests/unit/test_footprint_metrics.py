"""PowerTrip mode's footprint counters: each completed round adds FootprintModel.per_site."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import REGISTRY

from powertrip.config.experiment import ExperimentConfig
from powertrip.footprint import FootprintModel
from powertrip.rounds.loop import RoundRecord
from powertrip.services.aggregator import metrics
from powertrip.services.aggregator.footprint_metrics import FootprintMeter
from powertrip.services.aggregator.observed_power import ObservedPower
from powertrip.sites.grid import SiteGrid
from powertrip.sites.profiles import site_id

NAMES = (
    "powertrip_energy_joules_total",
    "powertrip_emissions_grams_total",
    "powertrip_electricity_cost_dollars_total",
)
SITES = (0, 2, 3)


def counters(sites=SITES) -> np.ndarray:
    """(metric, site) values now; an unseen series reads 0."""
    return np.array(
        [[REGISTRY.get_sample_value(n, {"site": site_id(s)}) or 0.0 for s in sites] for n in NAMES]
    )


def observed() -> ObservedPower:
    power = ObservedPower()
    power.record(0.0, np.array([1.0, 0.6, 0.3, 0.8]))
    power.record(900.0, np.array([0.5, 0.9, 1.0, 0.2]))
    return power


@pytest.mark.parametrize("round_power", ["start", "integrated"])
def test_a_completed_round_adds_its_per_site_footprint(round_power):
    exp = ExperimentConfig(
        round_power=round_power, grid_regions=3, grid_seed=4, train_kw=1.5, idle_kw=0.3
    )
    power, tau = observed(), 400.0
    meter = FootprintMeter(exp, power, tau)
    record = RoundRecord(7, 2000.0, 1500.0, len(SITES), 0.5, 1.0, SITES)
    before = counters()
    meter.count(record)
    added = counters() - before

    model = FootprintModel(
        power, tau, SiteGrid.from_settings(exp), 1.5, 0.3, integrated=round_power == "integrated"
    )
    kwh, kg, usd = model.per_site(record)
    np.testing.assert_allclose(added[0], kwh * metrics.JOULES_PER_KWH, rtol=1e-12)
    np.testing.assert_allclose(added[1], kg * 1000.0, rtol=1e-12)
    np.testing.assert_allclose(added[2], usd, rtol=1e-12)
    assert (added > 0).all()


def test_failed_and_empty_rounds_add_nothing():
    meter = FootprintMeter(ExperimentConfig(), observed(), 400.0)
    before = counters()
    meter.count(RoundRecord(3, 500.0, 400.0, 3, 0.1, 2.0, SITES, 0, "failed"))
    meter.count(RoundRecord(4, 900.0, 400.0, 0, 0.1, 2.0, ()))
    np.testing.assert_array_equal(counters(), before)


def test_a_round_before_any_power_report_is_left_out_not_failed(caplog):
    meter = FootprintMeter(ExperimentConfig(), ObservedPower(), 400.0)
    before = counters()
    meter.count(RoundRecord(1, 60.0, 60.0, 3, 0.5, 1.0, SITES))
    np.testing.assert_array_equal(counters(), before)
    assert "footprint not counted" in caplog.text
