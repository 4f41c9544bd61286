"""The emulated study: deterministic, clock-driven, and the cache never changes a result."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.config.experiment import build_config
from powertrip.config.sites import RoundTimeModel
from powertrip.federation import build_federation, load_workload
from powertrip.rounds.emulate import Emulator, TimeModel, TrajectoryCache
from powertrip.selection.base import Centralized, SelectAll, StaticTopK
from powertrip.selection.registry import build_policy
from powertrip.sites.profiles import ModelledLinks, StaticPower, generate_sites
from powertrip.study.powertrip import run_study

TINY = {
    "num_sites": 8,
    "num_samples": 800,
    "static_sweep": (2, 4, 8),
    "max_rounds": 6,
    "policies": (
        "powertrip",
        "powertrip-paper",
        "static-optimal",
        "select-all",
        "centralized-25",
        "random",
        "fixed-radius",
    ),
    "target_accuracy": 0.3,
    "ideal_compute_s": 10.0,
}


@pytest.fixture(scope="module")
def tiny_cfg():
    return build_config(None, **TINY)


@pytest.fixture(scope="module")
def tiny_data(tiny_cfg):
    return load_workload(tiny_cfg)


def _emulator(cfg, data, seed=0, cache=None):
    sites = generate_sites(cfg.num_sites, np.random.default_rng(cfg.site_seed))
    fed = build_federation(cfg, data, seed)
    tm = TimeModel(cfg.ideal_compute_s, cfg.update_bytes, RoundTimeModel.PER_SITE_MAX)
    return sites, Emulator(
        fed, sites, StaticPower(sites.base_power), ModelledLinks(sites), tm, seed, cache
    )


def test_same_seed_gives_identical_runs(tiny_cfg, tiny_data):
    _, a = _emulator(tiny_cfg, tiny_data, seed=3, cache=TrajectoryCache(max_entries=0))
    _, b = _emulator(tiny_cfg, tiny_data, seed=3, cache=TrajectoryCache(max_entries=0))
    ra = a.run(build_policy("powertrip"), None, 5)
    rb = b.run(build_policy("powertrip"), None, 5)
    assert ra.rounds == rb.rounds


def test_different_training_seeds_give_different_learning_curves(tiny_cfg, tiny_data):
    _, a = _emulator(tiny_cfg, tiny_data, seed=0)
    _, b = _emulator(tiny_cfg, tiny_data, seed=1)
    accs_a = [r.accuracy for r in a.run(SelectAll(), None, 3).rounds]
    accs_b = [r.accuracy for r in b.run(SelectAll(), None, 3).rounds]
    assert accs_a != accs_b


def test_trajectory_cache_reuses_training_without_changing_results(tiny_cfg, tiny_data):
    _, cached = _emulator(tiny_cfg, tiny_data, cache=TrajectoryCache())
    _, fresh = _emulator(tiny_cfg, tiny_data, cache=TrajectoryCache(max_entries=0))
    first = cached.run(StaticTopK(8), None, 4)
    again = cached.run(SelectAll(), None, 4)  # top-8 of 8 sites == all sites
    assert cached.cache.hits == 4
    assert [r.accuracy for r in again.rounds] == [r.accuracy for r in first.rounds]
    assert fresh.run(SelectAll(), None, 4).rounds == again.rounds


def test_round_duration_is_the_slowest_selected_site(tiny_cfg, tiny_data):
    sites, emu = _emulator(tiny_cfg, tiny_data)
    run = emu.run(SelectAll(), None, 2)
    comm = sites.latency_s + 1.5e9 * 8 / sites.bandwidth_bps
    expected = float(np.max(10.0 / sites.base_power + comm))
    assert run.rounds[0].duration_s == pytest.approx(expected)
    assert run.rounds[1].time_s == pytest.approx(2 * expected)


def test_centralized_rounds_take_tau_over_power_and_learn_like_select_all(tiny_cfg, tiny_data):
    _, emu = _emulator(tiny_cfg, tiny_data)
    central = emu.run(Centralized(0.25), None, 3)
    everyone = emu.run(SelectAll(), None, 3)
    assert [r.duration_s for r in central.rounds] == [40.0, 40.0, 40.0]
    assert [r.accuracy for r in central.rounds] == [r.accuracy for r in everyone.rounds]


def test_a_run_stops_at_the_first_round_reaching_the_target(tiny_cfg, tiny_data):
    _, emu = _emulator(tiny_cfg, tiny_data)
    full = emu.run(SelectAll(), None, 6)
    target = full.rounds[2].accuracy
    stopped = emu.run(SelectAll(), target, 6)
    first = next(r.round for r in full.rounds if r.accuracy >= target)
    assert len(stopped.rounds) == first
    assert stopped.time_to(target) == full.rounds[first - 1].time_s


def test_study_runs_every_policy_and_repeat_and_is_deterministic(tiny_cfg):
    cfg = tiny_cfg.model_copy(update={"repeats": 2})
    a = run_study(cfg)
    b = run_study(cfg)
    names = {s.policy for s in a.summaries}
    assert set(cfg.policies) <= names
    assert {f"static-{k}" for k in cfg.static_sweep} <= names
    assert a.k_star in cfg.static_sweep
    assert [(s.policy, s.repeat, s.time_to_accuracy_s) for s in a.summaries] == [
        (s.policy, s.repeat, s.time_to_accuracy_s) for s in b.summaries
    ]


def test_automatic_target_is_the_lowest_best_accuracy_of_the_sweep(tiny_cfg):
    cfg = tiny_cfg.model_copy(update={"target_accuracy": None, "policies": ("static-optimal",)})
    result = run_study(cfg)
    best = [max(r.accuracy for r in run.rounds) for _, run in result.runs]
    assert result.target_accuracy == min(best)
    assert all(s.reached for s in result.summaries)


def test_rounds_after_the_first_report_projections_on_the_previous_global_delta(
    tiny_cfg, tiny_data
):
    seen = []

    class Spy(StaticTopK):
        def observe(self, feedback):
            seen.append((feedback.mean_proj, feedback.mean_sq_proj, feedback.sq_norm_of_mean))

    _, emu = _emulator(tiny_cfg, tiny_data)
    emu.run(Spy(4), None, 3)
    assert seen[0][:2] == (None, None)  # round 1 has no previous delta
    for mean_proj, mean_sq_proj, sq_of_mean in seen[1:]:
        # Cauchy-Schwarz and Jensen: (mean p)^2 <= |mean d|^2 and (mean p)^2 <= mean p^2
        assert mean_proj**2 <= sq_of_mean * (1 + 1e-6)
        assert mean_proj**2 <= mean_sq_proj * (1 + 1e-6)


def test_the_directional_variant_runs_in_the_emulator(tiny_cfg, tiny_data):
    _, emu = _emulator(tiny_cfg, tiny_data)
    policy = build_policy("powertrip-directional")
    emu.run(policy, None, 4)
    assert policy.wants_direction
    assert policy.gain.along_direction.value is not None  # fitted from the projections


def test_the_split_half_accuracy_variant_gets_the_half_models_accuracy(tiny_cfg, tiny_data):
    _, emu = _emulator(tiny_cfg, tiny_data)
    policy = build_policy("powertrip-split-acc")
    seen = []
    observe = policy.observe
    policy.observe = lambda fb: (seen.append(fb.half_accuracy), observe(fb))
    emu.run(policy, None, 3)
    assert all(a is not None and 0.0 <= a <= 1.0 for a in seen)
    assert policy.gain.fit.value is not None  # the split-half fit took the half accuracies


def test_the_split_half_model_is_evaluated_only_for_a_policy_that_asks_even_from_the_cache(
    tiny_cfg, tiny_data
):
    evaluations = []
    _, emu = _emulator(tiny_cfg, tiny_data, cache=TrajectoryCache())
    evaluate = emu._evaluate
    emu._evaluate = lambda params: (evaluations.append(1), evaluate(params))[1]
    emu.run(StaticTopK(8), None, 3)  # no split-half: one evaluation a round
    assert len(evaluations) == 3
    # A policy wanting the probe on the same (cached) rounds gets it evaluated then, once each
    policy = build_policy("powertrip-split-acc")
    seen = []
    observe = policy.observe
    policy.observe = lambda fb: (seen.append((fb.selected.size, fb.half_accuracy)), observe(fb))
    emu.run(policy, None, 3)
    cached = [a for n, a in seen if n == 8]
    assert cached and all(a is not None and 0.0 <= a <= 1.0 for a in cached)
    fresh_emu = _emulator(tiny_cfg, tiny_data, cache=TrajectoryCache(max_entries=0))[1]
    again = build_policy("powertrip-split-acc")
    got = []
    observe2 = again.observe
    again.observe = lambda fb: (got.append(fb.half_accuracy), observe2(fb))
    fresh_emu.run(again, None, 3)
    assert [a for _, a in seen] == got  # deferred or not, the same probe
