"""A round's energy, emissions and electricity cost (powertrip.footprint) and their place in a
study's results."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from powertrip.config.experiment import build_config
from powertrip.config.footprint import FootprintSettings
from powertrip.footprint import Footprint, FootprintModel
from powertrip.rounds.loop import RoundRecord
from powertrip.sites.grid import SiteGrid
from powertrip.sites.profiles import StaticPower
from powertrip.study.powertrip import run_study
from powertrip.study.results import write_outputs

TAU = 100.0


def record(selected, duration_s, end_s=1000.0):
    return RoundRecord(1, end_s, duration_s, len(selected), 0.5, 1.0, tuple(selected))


def model(power, grid=None, train_kw=2.0, idle_kw=0.5):
    return FootprintModel(
        StaticPower(np.asarray(power, float)), TAU, grid or SiteGrid(), train_kw, idle_kw
    )


def test_a_capped_site_spends_the_same_training_energy_and_waits_for_the_straggler() -> None:
    # site 0 at full power computes 100 s, site 1 at half power 200 s; the round lasts 250 s
    e = model([1.0, 0.5]).site_energy_kwh(record([0, 1], 250.0))
    assert e[0] == pytest.approx((2.0 * TAU + 0.5 * 150.0) / 3600)
    assert e[1] == pytest.approx((2.0 * TAU + 0.5 * 50.0) / 3600)


def test_a_round_shorter_than_the_compute_time_charges_no_negative_waiting() -> None:
    e = model([0.25]).site_energy_kwh(record([0], 100.0))
    assert e[0] == pytest.approx(2.0 * TAU / 3600)


def test_emissions_and_cost_weigh_each_sites_energy_by_its_own_grid_at_the_round_start() -> None:
    grid = SiteGrid(regions=3, seed=4)
    m = model([1.0, 0.5, 0.8, 0.3], grid)
    rec = record([3, 0, 2], 400.0, end_s=7200.0)
    energy = m.site_energy_kwh(rec)
    started = 7200.0 - 400.0
    intensity = grid.intensity(4, started)[[3, 0, 2]]
    price = grid.price(4, started)[[3, 0, 2]]
    f = m.round(rec)
    assert f.energy_kwh == pytest.approx(energy.sum())
    assert f.emissions_kg == pytest.approx(float(energy @ intensity) / 1000)
    assert f.cost_usd == pytest.approx(float(energy @ price) / 1000)
    assert intensity[0] == grid.intensity(1, started)[0]  # site 3 is in region 3 mod 3 = 0


def test_the_grid_is_deterministic_in_its_seed_and_moves_over_the_day() -> None:
    a, b, c = SiteGrid(5, 0), SiteGrid(5, 0), SiteGrid(5, 1)
    assert np.array_equal(a.price(7, 3600.0), b.price(7, 3600.0))
    assert not np.array_equal(a.price(7, 3600.0), c.price(7, 3600.0))
    assert np.all(a.price(5, 0.0) > 0) and np.all(a.intensity(5, 0.0) > 0)
    day = [a.price(5, h * 3600.0) for h in range(24)]
    assert np.ptp(np.array(day), axis=0).min() > 0  # every region's price changes during a day


def test_footprints_add_and_an_empty_round_costs_nothing() -> None:
    m = model([1.0])
    assert m.round(record([], 0.0)) == Footprint()
    total = m.rounds([record([0], 150.0), record([0], 150.0)])
    assert total.energy_kwh == pytest.approx(2 * m.round(record([0], 150.0)).energy_kwh)


def test_settings_reject_negative_weights_and_power() -> None:
    with pytest.raises(ValueError):
        FootprintSettings(carbon_weight=-1.0)
    with pytest.raises(ValueError):
        FootprintSettings(train_kw=0.0)


def test_a_study_prices_every_run_up_to_the_target_except_the_centralized_baseline(tmp_path):
    cfg = build_config(
        "quick",
        num_sites=8,
        static_sweep=(2, 8),
        max_rounds=4,
        target_accuracy=0.99,
        num_samples=600,
        policies=("static-optimal", "select-all", "centralized-25"),
    )
    result = run_study(cfg)
    by = {s.policy: s for s in result.summaries}
    assert by["centralized-25"].footprint is None
    small, full = by["static-2"].footprint, by["select-all"].footprint
    assert small is not None and full is not None
    # the same number of rounds (the target is out of reach): 8 sites draw more than 2
    assert full.energy_kwh > small.energy_kwh > 0 and full.emissions_kg > small.emissions_kg
    write_outputs(result, tmp_path)
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert {r["policy"]: r["emissions_kg"] for r in rows}["centralized-25"] == ""
    assert float({r["policy"]: r["energy_kwh"] for r in rows}["select-all"]) > 0
