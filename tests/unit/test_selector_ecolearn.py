"""EcoLearn-style carbon-aware selection: Oort's utility pool, then the lowest-carbon sites."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from numpy.typing import NDArray

from powertrip.config.experiment import build_config
from powertrip.rounds.loop import SiteFeedback
from powertrip.selection.base import RoundContext
from powertrip.selection.ecolearn import EcoLearn, EcoLearnConfig, site_carbon
from powertrip.selection.oort import OortConfig
from powertrip.selection.registry import build_policy
from powertrip.sites.grid import SiteGrid
from powertrip.sites.profiles import SiteProfile
from powertrip.study.powertrip import run_study


@dataclass(frozen=True)
class CarbonProfile(SiteProfile):
    intensity: NDArray[np.float64]


def ctx(intensity=None, n=10, round_index=1, seed=0, now=0.0):
    kw = {"power": np.ones(n), "comm_s": np.full(n, 10.0), "distance_mi": np.ones(n)}
    profile = SiteProfile(**kw) if intensity is None else CarbonProfile(**kw, intensity=intensity)
    return RoundContext(round_index, now, profile, 50.0, 1e9, np.random.default_rng(seed))


def greedy_cfg(k, pool):
    oort = OortConfig(k=k, exploration=0.0, exploration_min=0.0, round_threshold=100.0)
    return EcoLearnConfig(oort=oort, pool_factor=pool, warmup_rounds=0)


def observe_all(policy, losses):
    n = len(losses)
    loss = np.asarray(losses, float)
    fb = SiteFeedback(
        1, np.arange(n), 1.0, 0.5, 0.4, loss=1.0, site_loss=loss, site_samples=np.ones(n)
    )
    policy.observe(fb)


def test_prefers_low_carbon_sites_within_the_utility_pool():
    carbon = np.array([500, 100, 400, 50, 300, 450, 20, 350, 250, 480], float)
    losses = [3.0, 2.9, 2.8, 2.7, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]  # sites 0-3 high utility
    policy = EcoLearn(greedy_cfg(k=2, pool=2.0))
    observe_all(policy, losses)
    # pool = the 4 highest-utility sites {0, 1, 2, 3}; the 2 lowest-carbon there: 3 (50), 1 (100)
    assert policy.select(ctx(carbon, round_index=2)).tolist() == [1, 3]
    # rho = N / K: pure carbon greedy, site 6 (20) and 3 (50)
    greedy = EcoLearn(greedy_cfg(k=2, pool=5.0))
    observe_all(greedy, losses)
    assert greedy.select(ctx(carbon, round_index=2)).tolist() == [3, 6]
    # rho = 1: Oort's utility alone (the two highest-loss sites)
    plain = EcoLearn(greedy_cfg(k=2, pool=1.0))
    observe_all(plain, losses)
    assert plain.select(ctx(carbon, round_index=2)).tolist() == [0, 1]


def test_early_rounds_provision_more_sites():
    policy = EcoLearn(EcoLearnConfig(oort=OortConfig(k=4), warmup_rounds=2, warmup_factor=1.5))
    assert policy.select(ctx(n=20, round_index=1)).size == 6
    assert policy.select(ctx(n=20, round_index=3)).size == 4


def test_synthetic_carbon_without_a_carbon_profile_is_deterministic():
    fallback = SiteGrid(regions=5, seed=0, hours=72.0)
    a = site_carbon(ctx(n=12, now=3600.0), fallback)
    b = site_carbon(ctx(n=12, now=3600.0), SiteGrid(5, 0, 72.0))
    assert np.array_equal(a, b) and np.all(a > 0)
    assert np.array_equal(a[:5], a[5:10])  # site i sits in region i mod 5
    assert len(set(a[:5].tolist())) == 5
    own = site_carbon(ctx(np.arange(12.0) + 1), fallback)  # a profile's own intensity wins
    assert own.tolist() == list(np.arange(12.0) + 1)


def test_bad_config_is_refused():
    with pytest.raises(ValueError):
        EcoLearnConfig(pool_factor=0.5)


def test_deterministic_and_runs_in_the_emulator():
    picks = [EcoLearn().select(ctx(n=30, seed=4)).tolist() for _ in range(2)]
    assert picks[0] == picks[1]
    assert isinstance(build_policy("ecolearn"), EcoLearn)
    cfg = build_config("quick", policies=("ecolearn",), num_samples=1000, max_rounds=3)
    run = run_study(cfg).runs[-1][1]
    assert run.policy == "ecolearn" and run.rounds[0].sites == 15  # 10 * 1.5 in warm-up
