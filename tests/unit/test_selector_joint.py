"""powertrip-joint: Algorithm 1 weighing emissions and electricity cost against round time."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.config.footprint import FootprintSettings
from powertrip.selection.base import RoundContext
from powertrip.selection.greedy import PROJECT_GREEDY, PowerTripGreedy
from powertrip.selection.joint import JointGreedy
from powertrip.selection.registry import PolicyContext, build_policy
from powertrip.sites.profiles import SiteProfile


def ctx(power, comm=None, now=3600.0):
    power = np.asarray(power, float)
    comm = np.full(power.size, 5.0) if comm is None else np.asarray(comm, float)
    profile = SiteProfile(power=power, comm_s=comm, distance_mi=np.ones(power.size))
    return RoundContext(1, now, profile, 50.0, 1e9, np.random.default_rng(0))


def joint(carbon=0.5, price=0.5):
    return JointGreedy(PROJECT_GREEDY, FootprintSettings(carbon_weight=carbon, price_weight=price))


def test_with_zero_weights_it_ranks_and_times_rounds_as_powertrip_does() -> None:
    c = ctx(np.linspace(0.1, 1.0, 20), np.linspace(1.0, 30.0, 20)[::-1])
    j, p = joint(0.0, 0.0), PowerTripGreedy(PROJECT_GREEDY)
    assert np.array_equal(j._top(c, 20), p._top(c, 20))
    order = p._top(c, 20)
    assert np.array_equal(j.prefix_times(c, order), p.prefix_times(c, order))


def test_among_equally_fast_sites_it_prefers_the_cleanest_and_cheapest_grid() -> None:
    c = ctx(np.ones(10))  # every site equally fast: the grid alone decides
    j = joint(1.0, 0.0)
    intensity = j.grid.intensity(10, c.now_s)
    top = j._top(c, 4)
    assert set(intensity[top]) == set(np.sort(intensity)[:4])


def test_the_joint_cost_equals_the_round_time_at_the_current_count_and_grows_faster_than_it():
    c = ctx(np.linspace(0.2, 1.0, 30))
    j = joint(1.0, 1.0)
    j.k = 10
    order = j._top(c, 30)
    times = PowerTripGreedy(PROJECT_GREEDY).prefix_times(c, order)
    cost = j.prefix_times(c, order)
    assert cost[9] == pytest.approx(times[9])
    # every extra site adds energy: relative to k = 10, J(k) rises faster than T(k)
    assert cost[29] / cost[9] > times[29] / times[9]
    assert cost[0] / cost[9] < times[0] / times[9]


def test_the_registry_builds_it_with_the_studys_grid_and_weights() -> None:
    settings = FootprintSettings(carbon_weight=2.0, price_weight=0.0, grid_seed=3)
    policy = build_policy("powertrip-joint", PolicyContext(footprint=settings))
    assert isinstance(policy, JointGreedy) and policy.settings is settings
    assert build_policy("powertrip-joint").settings == FootprintSettings()
