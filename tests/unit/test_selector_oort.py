"""Oort (OSDI 2021) as a selection policy: its utility, penalty, exploration and pacer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from powertrip.config.experiment import build_config
from powertrip.rounds.loop import SiteFeedback
from powertrip.selection.base import RoundContext
from powertrip.selection.oort import (
    Oort,
    OortConfig,
    OortUtility,
    site_round_times,
    site_utilities,
)
from powertrip.selection.registry import build_policy, known_policy_names
from powertrip.sites.profiles import SiteProfile
from powertrip.study.powertrip import run_study

TAU = 50.0


def ctx(power, comm, round_index=1, seed=0):
    p = np.asarray(power, float)
    profile = SiteProfile(power=p, comm_s=np.asarray(comm, float), distance_mi=np.ones(p.size))
    return RoundContext(round_index, 0.0, profile, TAU, 1e9, np.random.default_rng(seed))


def feedback(r, sites, loss, samples=None):
    sites = np.asarray(sites, np.int64)
    n = np.ones(sites.size) if samples is None else np.asarray(samples, float)
    return SiteFeedback(
        r, sites, 1.0, 0.5, 0.4, loss=1.0, site_loss=np.asarray(loss, float), site_samples=n
    )


def test_round_time_is_compute_over_power_plus_comm():
    c = ctx([1.0, 0.5], [10.0, 20.0])
    assert np.allclose(site_round_times(c), [TAU + 10, 2 * TAU + 20])


def test_statistical_utility_is_samples_times_loss():
    fb = feedback(1, [3, 5], [2.0, 0.5], [100, 40])
    assert np.allclose(site_utilities(fb), [200.0, 20.0])


def test_staleness_bonus_and_straggler_penalty():
    cfg = OortConfig(round_threshold=0.0, clip_bound=1.0)
    s = OortUtility(cfg)
    s.utility, s.last_round = {0: 1.0, 1: 3.0, 2: 3.0}, {0: 1, 1: 2, 2: 2}
    times = np.array([10.0, 10.0, 40.0])  # T = 0th percentile = 10 s
    util = s.scores(round_index=4, times=times)
    bonus = lambda last: math.sqrt(0.1 * math.log(4) / last)  # noqa: E731
    assert util[0] == pytest.approx(0.0 + bonus(1))  # min-max normalised utility 0
    assert util[1] == pytest.approx(1.0 + bonus(2))
    # same utility, 4x slower than T: penalised by (T / t)^alpha = (1/4)^2
    assert util[2] == pytest.approx((1.0 + bonus(2)) * (10 / 40) ** 2)


def test_exploits_high_loss_fast_sites():
    cfg = OortConfig(k=2, exploration=0.0, exploration_min=0.0, round_threshold=100.0)
    policy = Oort(cfg)
    c = ctx([1.0] * 6, [10.0] * 6)
    policy.observe(feedback(1, range(6), [0.1, 3.0, 0.2, 2.5, 0.3, 0.1]))
    assert set(policy.select(ctx([1.0] * 6, [10.0] * 6, 2)).tolist()) == {1, 3}
    # the slowest high-loss site loses to a fast medium-loss one once T is the fastest time
    slow = Oort(OortConfig(k=1, exploration=0.0, exploration_min=0.0, round_threshold=0.0))
    slow.observe(feedback(1, range(3), [3.0, 2.0, 0.1]))
    power = [0.1, 1.0, 1.0]  # site 0 ten times slower
    assert slow.select(ctx(power, [10.0] * 3, 2)).tolist() == [1]
    assert c.profile.size == 6


def test_explores_unexplored_sites_and_decays():
    policy = Oort(OortConfig(k=4))
    c = ctx(np.linspace(0.1, 1, 20), np.full(20, 10.0))
    first = policy.select(c)
    assert first.size == 4 and policy.state.exploration == pytest.approx(0.9 * 0.98)
    policy.observe(feedback(1, first, [1.0] * 4))
    second = policy.select(ctx(np.linspace(0.1, 1, 20), np.full(20, 10.0), 2))
    # eps = 0.88: int(4 * 0.12) = 0 exploited, all four explored, none seen before
    assert not set(second.tolist()) & set(first.tolist())
    for _ in range(200):
        policy.state.decay()
    assert policy.state.exploration == pytest.approx(0.3)


def test_pacer_relaxes_preferred_duration_when_utility_stalls():
    s = OortUtility(OortConfig(pacer_step=2, pacer_delta=5.0, round_threshold=30.0))
    for r, u in enumerate([5.0, 5.0, 1.0, 1.0], start=1):
        s.observe(feedback(r, [0], [u]))
    assert s.threshold == 35.0
    times = np.arange(1.0, 101.0)
    assert s.preferred_duration(times) == 36.0


def test_deterministic_given_the_context_rng():
    def run(seed):
        policy, picks = Oort(OortConfig(k=3)), []
        for r in range(1, 8):
            c = ctx(np.linspace(0.1, 1, 12), np.linspace(5, 60, 12), r, seed)
            sel = policy.select(c)
            policy.observe(feedback(r, sel, np.linspace(0.5, 2, sel.size)))
            picks.append(sel.tolist())
        return picks

    assert run(1) == run(1)


def test_registered_and_runs_in_the_emulator():
    assert "oort" in known_policy_names() and isinstance(build_policy("oort"), Oort)
    cfg = build_config("quick", policies=("oort",), num_samples=1000, max_rounds=3)
    result = run_study(cfg)
    run = result.runs[-1][1]
    assert run.policy == "oort" and len(run.rounds) >= 1
    assert all(r.sites == 10 for r in run.rounds)  # K = 20% of the quick preset's 50 sites


def test_a_site_whose_update_never_arrived_keeps_its_last_utility():
    state = OortUtility(OortConfig())
    state.observe(feedback(1, [0, 1], [2.0, 3.0], [10, 10]))
    state.observe(feedback(2, [0, 1], [float("nan"), 1.0], [10, 10]))  # site 0 failed round 2
    assert state.utility[0] == 20.0 and state.last_round[0] == 1
    assert state.utility[1] == 10.0 and math.isfinite(state.round_utility[-1])
