"""Spare-power forecasts (powertrip/sites/forecast.py), the RoundContext seam and forecast-aware
PowerTrip (powertrip/selection/forecast_greedy.py)."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.config.experiment import build_config
from powertrip.rounds.loop import RoundRecord, TimeModel, run_rounds
from powertrip.selection.base import RoundContext, SelectionPolicy
from powertrip.selection.forecast_greedy import ForecastGreedy
from powertrip.selection.greedy import GreedyConfig
from powertrip.selection.registry import build_policy
from powertrip.sites.forecast import (
    EwmaAR1,
    NoisyOracle,
    Persistence,
    build_forecaster,
    compute_times_s,
    reversion,
    window_mean,
)
from powertrip.sites.profiles import SiteProfile, StaticPower


class Ramp:
    """Site i's power is a_i + b_i * t (a PowerSource)."""

    def __init__(self, a, b):
        self.a, self.b = np.asarray(a, float), np.asarray(b, float)

    def power_at(self, t_s):
        return np.clip(self.a + self.b * t_s, 0.01, 1.0)


class Step:
    """Every site at ``lo`` before ``at`` s, ``hi`` from then on."""

    def __init__(self, lo, hi, at, n=3):
        self.lo, self.hi, self.at, self.n = lo, hi, at, n

    def power_at(self, t_s):
        return np.full(self.n, self.hi if t_s >= self.at else self.lo)


def test_persistence_returns_the_current_value():
    ramp = Ramp([0.2, 0.5], [1e-4, -1e-4])
    f = Persistence(ramp)
    np.testing.assert_array_equal(f.mean_power(600.0, 3600.0), ramp.power_at(600.0))


def test_oracle_without_error_is_the_true_future_mean():
    ramp = Ramp([0.2, 0.8], [1e-4, -1e-4])
    got = NoisyOracle(ramp).mean_power(100.0, 1000.0)
    # exact mean of a line over [100, 1100]: its value at the midpoint
    np.testing.assert_allclose(got, ramp.power_at(600.0), rtol=1e-12)
    np.testing.assert_allclose(window_mean(ramp, 100.0, 0.0), ramp.power_at(100.0))


def test_oracle_error_is_multiplicative_with_the_given_std_and_seeded():
    n = 20_000
    power = StaticPower(np.full(n, 0.5))
    f = NoisyOracle(power, error=0.1, seed=3)
    ratio = f.mean_power(60.0, 300.0) / 0.5 - 1.0
    assert abs(ratio.mean()) < 0.005
    assert ratio.std() == pytest.approx(0.1, rel=0.03)
    # deterministic by (seed, now); the same relative error whatever the horizon
    np.testing.assert_array_equal(f.mean_power(60.0, 300.0), f.mean_power(60.0, 900.0))
    again = NoisyOracle(power, error=0.1, seed=3).mean_power(60.0, 300.0)
    np.testing.assert_array_equal(again, f.mean_power(60.0, 300.0))
    assert not np.array_equal(NoisyOracle(power, 0.1, seed=4).mean_power(60.0, 300.0), again)
    # multiplicative: a site at twice the power gets twice the error
    pair = NoisyOracle(StaticPower(np.array([0.2, 0.4])), error=0.2, seed=1)
    z = pair.noise(0.0, 2)
    np.testing.assert_allclose(pair.mean_power(0.0, 60.0), [0.2, 0.4] * (1 + 0.2 * z))


def test_ewma_tracks_a_step_change():
    step = Step(0.2, 0.8, at=0.0)
    f = EwmaAR1(step, step_s=300.0, half_life_s=3600.0, warmup_s=86_400.0)
    mean_before, _ = f.state(-300.0)
    assert mean_before == pytest.approx(0.2)
    early = f.state(600.0)[0][0]
    later = f.state(6 * 3600.0)[0][0]
    assert 0.2 < early < later and later == pytest.approx(0.8, abs=0.02)
    # the forecast starts from the current value and is always within [lo, hi]
    assert np.all((f.mean_power(600.0, 600.0) > 0.2) & (f.mean_power(600.0, 600.0) <= 0.8))
    assert f.mean_power(6 * 3600.0, 600.0) == pytest.approx(np.full(3, 0.8), abs=0.02)


def test_reversion_is_one_at_zero_horizon_and_decays():
    phi = np.array([0.5, 0.9, 0.999])
    np.testing.assert_array_equal(reversion(phi, 0.0), np.ones(3))
    g = reversion(phi, 4.0)
    assert np.all((g > 0) & (g < 1)) and g[0] < g[1] < g[2]


def test_compute_times_follow_the_power_during_the_round():
    # full power for 60 s then 0.5: tau = 90 s of work takes 60 + 30 / 0.5 = 120 s
    step = Step(1.0, 0.5, at=60.0, n=1)
    assert compute_times_s(step, 0.0, 90.0, np.array([0]), step_s=60.0)[0] == pytest.approx(120.0)
    static = StaticPower(np.array([0.25, 0.5]))
    np.testing.assert_allclose(compute_times_s(static, 0.0, 50.0, np.array([0, 1])), [200, 100])


def _ctx(forecast, power=(0.5, 0.5)):
    power = np.asarray(power, float)
    profile = SiteProfile(power=power, comm_s=np.full(power.size, 5.0), distance_mi=np.ones(2))
    return RoundContext(1, 0.0, profile, 50.0, 1e9, np.random.default_rng(0), forecast)


def test_forecast_policy_prefers_the_site_whose_power_rises():
    rising_second = Ramp([0.5, 0.5], [-4e-3, 4e-3])  # equal now; site 1 rises, site 0 drops
    policy = ForecastGreedy(GreedyConfig(k0=1), name="powertrip-forecast")
    assert policy.select(_ctx(NoisyOracle(rising_second))).tolist() == [1]
    rising_first = Ramp([0.5, 0.5], [4e-3, -4e-3])
    policy = ForecastGreedy(GreedyConfig(k0=1), name="powertrip-forecast")
    assert policy.select(_ctx(NoisyOracle(rising_first))).tolist() == [0]
    # without a forecast it is PowerTrip: the tie goes to the first site
    assert ForecastGreedy(GreedyConfig(k0=1)).select(_ctx(None)).tolist() == [0]


def test_registry_builds_the_forecast_variant_and_keeps_powertrip():
    assert isinstance(build_policy("powertrip-forecast"), ForecastGreedy)
    assert not isinstance(build_policy("powertrip"), ForecastGreedy)


def test_forecast_none_leaves_the_context_without_one():
    cfg = build_config("quick")
    assert cfg.forecast == "none" and cfg.round_power == "start"
    assert "forecast" not in cfg.model_dump() and "round_power" not in cfg.model_dump()
    assert build_forecaster(cfg.forecast, StaticPower(np.ones(2))) is None
    assert build_config("quick", forecast="ewma").model_dump()["forecast"] == "ewma"
    with pytest.raises(ValueError):
        build_config("quick", forecast="ewma", forecast_error=0.1)

    seen: list[RoundContext] = []

    class Spy(SelectionPolicy):
        name = "spy"

        def select(self, ctx):
            seen.append(ctx)
            return np.array([0])

    class Executor:
        def evaluate_initial(self):
            return 0.0, 1.0

        def execute(self, r, selected, profile, split_half):
            return None

    from powertrip.rounds.clock import EmulatedClock

    profile = _ctx(None).profile
    records: list[RoundRecord] = []
    run_rounds(
        Spy(),
        Executor(),
        lambda t: profile,
        TimeModel(50.0, 1e9),
        EmulatedClock(),
        0,
        None,
        2,
        on_round=records.append,
    )
    assert len(seen) == 2 and all(c.forecast is None for c in seen)
    oracle = NoisyOracle(StaticPower(profile.power))
    seen.clear()
    run_rounds(
        Spy(),
        Executor(),
        lambda t: profile,
        TimeModel(50.0, 1e9),
        EmulatedClock(),
        0,
        None,
        1,
        forecast=oracle,
    )
    assert seen[0].forecast is oracle
