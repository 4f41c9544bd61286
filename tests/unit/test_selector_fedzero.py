"""FedZero (e-Energy 2024): forecast filter, shortest round, and the MIP against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from powertrip.config.experiment import build_config
from powertrip.rounds.loop import SiteFeedback
from powertrip.selection.base import RoundContext
from powertrip.selection.fedzero import (
    FedZero,
    FedZeroConfig,
    persistence_forecast,
    solve_selection,
    window_work,
)
from powertrip.selection.registry import build_policy
from powertrip.sites.profiles import SiteProfile
from powertrip.study.powertrip import run_study

TAU = 60.0


def ctx(power, comm, seed=0):
    p = np.asarray(power, float)
    profile = SiteProfile(power=p, comm_s=np.asarray(comm, float), distance_mi=np.ones(p.size))
    return RoundContext(1, 0.0, profile, TAU, 1e9, np.random.default_rng(seed))


def test_window_work_is_forecast_energy_before_upload():
    f = np.array([[1.0, 1.0, 1.0], [0.5, 0.0, 1.0]])
    w = window_work(f, np.array([0.0, 30.0]), tau=60.0, step_s=60.0)
    assert np.allclose(w[0], [1.0, 2.0, 3.0])
    # site 1 computes for d - 30 s: 30 s at 0.5, then 30 s more at 0.5, then 30 s at 0.0...
    assert np.allclose(w[1], [0.25, 0.5, 0.5 + 0.5])


def test_mip_matches_brute_force_on_eight_sites():
    rng = np.random.default_rng(7)
    for trial in range(20):
        utility = rng.uniform(0.1, 2.0, 8)
        cap = rng.uniform(0.5, 2.0, 8)  # W_i: passes each site's energy allows
        domains = rng.integers(0, 3, 8)
        domain_cap = rng.uniform(1.0, 3.5, 3)  # shared excess energy of three power domains
        k = int(rng.integers(1, 5))
        best, best_set = -np.inf, None
        for subset in itertools.combinations(range(8), k):
            s = list(subset)
            if np.any(cap[s] < 1.0):
                continue
            load = np.bincount(domains[s], minlength=3)
            if np.any(load > domain_cap + 1e-9):
                continue
            if utility[s].sum() > best:
                best, best_set = utility[s].sum(), set(s)
        got = solve_selection(utility, cap, k, domains=domains, domain_cap=domain_cap)
        if best_set is None:
            assert got is None, trial
        else:
            assert got is not None and set(got.tolist()) == best_set, trial
            assert np.all(cap[got] >= 1.0)
            assert np.all(np.bincount(domains[got], minlength=3) <= domain_cap + 1e-9)


def test_mip_with_partial_work_respects_energy():
    # m_min = 0.5: a site with energy for 0.6 passes can join and does 0.6
    got = solve_selection(np.array([1.0, 5.0, 2.0]), np.array([2.0, 0.6, 0.4]), 2, 0.5, 1.0)
    assert set(got.tolist()) == {0, 1}


def test_shortest_round_then_highest_utility():
    # round times tau/P + comm: 70, 70, 130, 250 s; K = 2 fits in a 2-minute round (d = 120 s)
    policy = FedZero(FedZeroConfig(k=2))
    power, comm = [1.0, 1.0, 0.5, 0.25], [10.0, 10.0, 10.0, 10.0]
    assert policy.select(ctx(power, comm)).tolist() == [0, 1]
    assert policy.last_duration_s == 120.0
    # a 3-minute round admits site 2; with the highest utility it displaces site 0 or 1
    policy = FedZero(FedZeroConfig(k=2))
    policy.observe(
        SiteFeedback(
            1,
            np.arange(4),
            1.0,
            0.5,
            0.4,
            loss=1.0,
            site_loss=np.array([1.0, 2.0, 9.0, 9.0]),
            site_samples=np.ones(4),
        )
    )
    assert policy.select(ctx(power, comm)).tolist() == [0, 1]  # d = 2 min still suffices
    policy.cfg = FedZeroConfig(k=3)
    assert policy.select(ctx(power, comm)).tolist() == [0, 1, 2]


def test_forecast_seam_changes_the_choice():
    def falling(c, steps, step_s):  # site 0's excess is forecast to drop to 20%
        f = persistence_forecast(c, steps, step_s)
        f[0, :] = 0.2
        return f

    # persistence: sites 0 and 1 finish in one minute; with the forecast site 0 needs five,
    # site 2 (40%) two and a half, so the shortest round (3 min) takes sites 1 and 2
    power, comm = [1.0, 1.0, 0.4], [0.0, 0.0, 0.0]
    assert FedZero(FedZeroConfig(k=2)).select(ctx(power, comm)).tolist() == [0, 1]
    picked = FedZero(FedZeroConfig(k=2), forecast=falling).select(ctx(power, comm))
    assert picked.tolist() == [1, 2]
    with pytest.raises(ValueError):
        FedZero(forecast=lambda c, s, d: np.ones((1, 1))).select(ctx(power, comm))


def test_registered_and_runs_in_the_emulator():
    assert isinstance(build_policy("fedzero"), FedZero)
    cfg = build_config("quick", policies=("fedzero",), num_samples=1000, max_rounds=3)
    run = run_study(cfg).runs[-1][1]
    assert run.policy == "fedzero" and all(r.sites == 10 for r in run.rounds)
