"""Every selection policy on tiny hand-made site sets, and the policy factory."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.selection.base import (
    Centralized,
    FixedRadius,
    RandomK,
    RankingConfig,
    RoundContext,
    RoundFeedback,
    SelectAll,
    StaticTopK,
)
from powertrip.selection.greedy import PAPER_GREEDY, GainModel, PowerTripGreedy, SearchMode
from powertrip.selection.registry import (
    PolicyContext,
    build_policy,
    known_policy_names,
    validate_policy_name,
)
from powertrip.selection.scoring import Estimator, Ranking, WeightSchedule
from powertrip.sites.profiles import SiteProfile

GB = 1e9

#: Five sites (power, comm s, distance mi), worked by hand below:
#:   0: 0.9,  8.0, 5000  -- strong but far
#:   1: 0.3,  1.0,  200  -- weak, nearest
#:   2: 1.0,  2.0,  800  -- strong and near: best under every weighting
#:   3: 0.6,  1.5,  950  -- middling, near
#:   4: 0.5, 12.0, 9000  -- weak and farthest: worst under every weighting
#: P~ = P / 1.0 = [0.9, 0.3, 1.0, 0.6, 0.5]; C~ = C / 12 = [0.6667, 0.0833, 0.1667, 0.125, 1.0]
FIVE = SiteProfile(
    power=np.array([0.9, 0.3, 1.0, 0.6, 0.5]),
    comm_s=np.array([8.0, 1.0, 2.0, 1.5, 12.0]),
    distance_mi=np.array([5000.0, 200.0, 800.0, 950.0, 9000.0]),
)


def ctx(
    site_profile: SiteProfile = FIVE,
    update_gb: float = 1.5,
    ideal_s: float = 10.0,
    seed: int = 0,
    rnd: int = 1,
) -> RoundContext:
    return RoundContext(
        round=rnd,
        now_s=0.0,
        profile=site_profile,
        ideal_compute_s=ideal_s,
        update_bytes=update_gb * GB,
        rng=np.random.default_rng(seed),
    )


# -------------------------------------------------------------------------------- StaticTopK


@pytest.mark.parametrize(
    ("update_gb", "k", "expected"),
    [
        # 1.5 GB, (0.5, 0.5): S = [0.117, 0.108, 0.417, 0.238, -0.25] -> order 2, 3, 0, 1, 4
        (1.5, 2, [2, 3]),
        (1.5, 3, [2, 3, 0]),
        # 1 GB, (0.7, 0.3): S = [0.43, 0.185, 0.65, 0.383, 0.05] -> order 2, 0, 3, 1, 4
        (1.0, 2, [2, 0]),
        # 2 GB, (0.3, 0.7): S = [-0.197, 0.032, 0.183, 0.093, -0.55] -> order 2, 3, 1, 0, 4
        (2.0, 3, [2, 3, 1]),
    ],
)
def test_static_top_k_picks_the_best_scored_sites(update_gb, k, expected):
    # Prepare
    policy = StaticTopK(k)

    # Execute
    selected = policy.select(ctx(update_gb=update_gb))

    # Assert
    assert selected.tolist() == expected
    assert policy.name == f"static-{k}"


def test_static_top_k_keeps_the_same_sites_every_round():
    policy = StaticTopK(2)
    rounds = [policy.select(ctx(rnd=r, seed=r)).tolist() for r in range(1, 5)]
    assert rounds == [[2, 3]] * 4


def test_static_top_k_with_k_above_n_selects_every_site_in_rank_order():
    # 1.5 GB order from the test above: 2, 3, 0, 1, 4
    assert StaticTopK(50).select(ctx()).tolist() == [2, 3, 0, 1, 4]


def test_static_top_k_uses_its_ranking_config():
    # highest power first: P = [0.9, 0.3, 1.0, 0.6, 0.5] -> 2, 0, 3
    by_power = StaticTopK(3, RankingConfig(ranking=Ranking.POWER))
    # lowest latency first: C = [8, 1, 2, 1.5, 12] -> 1, 3, 2
    by_latency = StaticTopK(3, RankingConfig(ranking=Ranking.LATENCY))
    assert by_power.select(ctx()).tolist() == [2, 0, 3]
    assert by_latency.select(ctx()).tolist() == [1, 3, 2]


def test_a_fixed_alpha_overrides_the_update_size_schedule():
    # alpha = 1, beta = 0: score = P~ only -> 2 (1.0), 0 (0.9), even for a 2 GB update
    policy = StaticTopK(2, RankingConfig(alpha=1.0))
    assert policy.select(ctx(update_gb=2.0)).tolist() == [2, 0]


def test_compute_share_ranking_recovers_the_median_bandwidth_from_comm_times():
    # Prepare: zero latency, 1.5 GB = 12e9 bit over 10, 5, 2.5 Gbps -> comm = 1.2, 2.4, 4.8 s.
    # Median comm 2.4 s -> B_med = 5 Gbps -> typical transfer 2.4 s.
    # P = [0.5, 0.3, 1.0]; P~ = P; C~ = [0.25, 0.5, 1.0]
    three = SiteProfile(np.array([0.5, 0.3, 1.0]), np.array([1.2, 2.4, 4.8]), np.zeros(3))
    policy = StaticTopK(3, RankingConfig(weights=WeightSchedule.COMPUTE_SHARE))

    # Execute
    # tau = 7.2: alpha = 7.2 / 9.6 = 0.75 -> S = [0.3125, 0.1, 0.5] -> 2, 0, 1
    compute_heavy = policy.select(ctx(three, ideal_s=7.2))
    # tau = 0.8: alpha = 0.8 / 3.2 = 0.25 -> S = [-0.0625, -0.3, -0.5] -> 0, 1, 2
    comm_heavy = policy.select(ctx(three, ideal_s=0.8))

    # Assert
    assert compute_heavy.tolist() == [2, 0, 1]
    assert comm_heavy.tolist() == [0, 1, 2]


def test_static_top_k_ignores_feedback():
    # Prepare
    policy = StaticTopK(2)
    before = policy.select(ctx())

    # Execute
    policy.observe(RoundFeedback(1, before, 20.0, accuracy=0.1, previous_accuracy=0.5))

    # Assert
    assert policy.select(ctx()).tolist() == before.tolist()


@pytest.mark.parametrize("bad_k", [0, -1])
def test_static_top_k_needs_at_least_one_site(bad_k):
    with pytest.raises(ValueError, match="k >= 1"):
        StaticTopK(bad_k)


# --------------------------------------------------------------------------------- SelectAll


def test_select_all_takes_every_site():
    selected = SelectAll().select(ctx())
    assert selected.tolist() == [0, 1, 2, 3, 4]
    assert selected.dtype == np.int64


# ------------------------------------------------------------------------------- FixedRadius


def test_fixed_radius_takes_every_site_within_1000_miles():
    # distances 5000, 200, 800, 950, 9000 -> sites 1, 2, 3
    assert FixedRadius(1000.0).select(ctx()).tolist() == [1, 2, 3]


def test_fixed_radius_includes_a_site_exactly_on_the_radius():
    # 800 mi is on the 800 mi radius; 950 mi is outside
    assert FixedRadius(800.0).select(ctx()).tolist() == [1, 2]


def test_fixed_radius_falls_back_to_the_nearest_site_when_none_is_inside():
    # nothing within 100 mi; the nearest site is site 1 at 200 mi
    selected = FixedRadius(100.0).select(ctx())
    assert selected.tolist() == [1]
    assert selected.dtype == np.int64


@pytest.mark.parametrize("bad_radius", [0.0, -50.0])
def test_fixed_radius_must_be_positive(bad_radius):
    with pytest.raises(ValueError, match="radius"):
        FixedRadius(bad_radius)


# ------------------------------------------------------------------------------------ RandomK


def test_random_k_is_reproducible_with_a_seeded_rng():
    # Prepare / Execute: the same seed gives the same sample, a stream of rounds too
    a = [RandomK(3).select(ctx(seed=11)).tolist() for _ in range(3)]
    shared = ctx(seed=11)
    policy = RandomK(3)
    stream_1 = [policy.select(shared).tolist() for _ in range(5)]
    shared_again = ctx(seed=11)
    stream_2 = [policy.select(shared_again).tolist() for _ in range(5)]

    # Assert
    assert a[0] == a[1] == a[2]
    assert stream_1 == stream_2
    assert stream_1[0] == a[0]


def test_random_k_draws_k_distinct_sorted_sites_each_round():
    # Prepare
    policy = RandomK(3)
    context = ctx(seed=3)

    # Execute
    draws = [policy.select(context) for _ in range(200)]

    # Assert: no duplicates, in range, sorted, int64, and not the same sample every round
    for s in draws:
        assert s.dtype == np.int64
        assert len(set(s.tolist())) == 3
        assert s.min() >= 0 and s.max() <= 4
        assert s.tolist() == sorted(s.tolist())
    assert len({tuple(s.tolist()) for s in draws}) > 1


def test_random_k_samples_every_site_about_equally_often():
    # each of 5 sites is in a 3-of-5 sample with probability 0.6: about 120 of 200 rounds
    context = ctx(seed=4)
    policy = RandomK(3)
    counts = np.bincount(np.concatenate([policy.select(context) for _ in range(200)]), minlength=5)
    assert counts.sum() == 600
    assert all(90 <= c <= 150 for c in counts)


def test_random_k_with_k_above_n_selects_every_site():
    assert RandomK(70).select(ctx()).tolist() == [0, 1, 2, 3, 4]


def test_random_k_needs_at_least_one_site():
    with pytest.raises(ValueError, match="k >= 1"):
        RandomK(0)


# -------------------------------------------------------------------------------- Centralized


@pytest.mark.parametrize(("fraction", "name"), [(0.25, "centralized-25"), (0.5, "centralized-50")])
def test_centralized_trains_all_partitions_at_one_capped_site(fraction, name):
    # Prepare
    policy = Centralized(fraction)

    # Execute
    selected = policy.select(ctx())

    # Assert: every partition takes part; the engine times it as one site at P_c with no comm
    assert selected.tolist() == [0, 1, 2, 3, 4]
    assert policy.centralized_power == fraction
    assert policy.name == name


def test_only_the_centralized_baseline_declares_a_centralized_power():
    assert StaticTopK(2).centralized_power is None
    assert SelectAll().centralized_power is None


@pytest.mark.parametrize("bad_fraction", [0.0, -0.1, 1.01])
def test_centralized_power_must_be_in_0_1(bad_fraction):
    with pytest.raises(ValueError, match="centralized power"):
        Centralized(bad_fraction)


# ----------------------------------------------------------------------------- policy factory


@pytest.mark.parametrize(
    ("name", "gain", "estimator", "ranking", "search"),
    [
        ("powertrip", GainModel.NOISE_DIRECTIONAL, Estimator.MAX, Ranking.ROUND_TIME, None),
        ("powertrip-noise", GainModel.NOISE_SCALE, Estimator.MAX, Ranking.ROUND_TIME, None),
        (
            "powertrip-split-acc",
            GainModel.SPLIT_HALF_ACCURACY,
            Estimator.MAX,
            Ranking.ROUND_TIME,
            None,
        ),
        ("powertrip-paper", GainModel.LOG, Estimator.MEAN_POWER, Ranking.POWER_TO_COST, None),
        (
            "powertrip-prefix",
            GainModel.LOG,
            Estimator.MEAN_POWER,
            Ranking.POWER_TO_COST,
            SearchMode.INCREMENTAL_PREFIX,
        ),
        (
            "powertrip-kappa",
            GainModel.KAPPA_HEADROOM,
            Estimator.MEAN_POWER,
            Ranking.POWER_TO_COST,
            None,
        ),
        ("powertrip-maxest", GainModel.LOG, Estimator.MAX, Ranking.POWER_TO_COST, None),
        ("highest-power", GainModel.LOG, Estimator.MEAN_POWER, Ranking.POWER, None),
        ("lowest-latency", GainModel.LOG, Estimator.MEAN_POWER, Ranking.LATENCY, None),
    ],
)
def test_build_policy_configures_every_greedy_variant(name, gain, estimator, ranking, search):
    # Execute
    policy = build_policy(name)

    # Assert
    assert isinstance(policy, PowerTripGreedy)
    assert policy.name == name
    assert policy.config.gain is gain
    assert policy.config.estimator is estimator
    assert policy.config.ranking.ranking is ranking
    assert policy.config.search is (search or SearchMode.WINDOW_ARGMAX)


def test_paper_greedy_uses_the_reconstructed_defaults():
    # Algorithm 1 as reconstructed: k0 = 10, w = 5, p = 3, m = 3, epsilon = 1e-4, log gain,
    # mean-power estimator
    cfg = PAPER_GREEDY
    assert (cfg.k0, cfg.window, cfg.patience, cfg.trend_rounds) == (10, 5, 3, 3)
    assert cfg.gain_floor == 1e-4
    assert (cfg.gain, cfg.estimator, cfg.search) == (
        GainModel.LOG,
        Estimator.MEAN_POWER,
        SearchMode.WINDOW_ARGMAX,
    )
    assert cfg.ranking == RankingConfig()  # Eq. 8 with the linear weight schedule


def test_build_policy_applies_greedy_overrides():
    policy = build_policy("powertrip-paper", PolicyContext(greedy_overrides={"k0": 3, "window": 2}))
    assert isinstance(policy, PowerTripGreedy)
    assert (policy.config.k0, policy.config.window) == (3, 2)
    assert PAPER_GREEDY.k0 == 10  # the shared variant is untouched


def test_build_policy_returns_a_fresh_instance_each_time():
    a, b = build_policy("powertrip"), build_policy("powertrip")
    assert a is not b
    a.select(ctx())
    assert a.k_history == [5] and b.k_history == []  # k0 = 10 capped at the 5 sites


@pytest.mark.parametrize(("name", "k"), [("static-40", 40), ("static-1", 1), ("static-100", 100)])
def test_build_policy_parses_static_k(name, k):
    policy = build_policy(name)
    assert isinstance(policy, StaticTopK)
    assert policy.k == k
    assert policy.name == name


def test_static_optimal_is_static_top_k_star():
    policy = build_policy("static-optimal", PolicyContext(k_star=70))
    assert isinstance(policy, StaticTopK)
    assert (policy.k, policy.name) == (70, "static-optimal")


def test_random_uses_k_star_sites():
    policy = build_policy("random", PolicyContext(k_star=70))
    assert isinstance(policy, RandomK)
    assert policy.k == 70


@pytest.mark.parametrize("name", ["static-optimal", "random"])
def test_policies_sized_by_k_star_refuse_to_build_without_it(name):
    with pytest.raises(ValueError, match="needs k\\* from a static sweep"):
        build_policy(name)


def test_build_policy_builds_the_simple_baselines():
    assert isinstance(build_policy("select-all"), SelectAll)
    radius = build_policy("fixed-radius", PolicyContext(radius_mi=750.0))
    assert isinstance(radius, FixedRadius) and radius.radius_mi == 750.0
    for name, fraction in (("centralized-25", 0.25), ("centralized-50", 0.5)):
        policy = build_policy(name)
        assert isinstance(policy, Centralized)
        assert policy.centralized_power == fraction
        assert policy.name == name


def test_every_known_policy_name_builds():
    for name in known_policy_names():
        concrete = "static-10" if name == "static-<k>" else name
        assert validate_policy_name(concrete) == concrete
        policy = build_policy(concrete, PolicyContext(k_star=5))
        assert policy.select(ctx()).size >= 1


@pytest.mark.parametrize(
    "name",
    [
        "bogus",
        "static-",
        "static-abc",
        "static--3",
        "Static-10",
        "static-10 ",
        "centralized-75",
        "powertrip-",
        "",
    ],
)
def test_unknown_policy_names_are_rejected_with_the_list_of_known_ones(name):
    with pytest.raises(ValueError, match="unknown policy") as exc:
        validate_policy_name(name)
    assert "static-<k>" in str(exc.value) and "powertrip" in str(exc.value)
    with pytest.raises(ValueError, match="unknown policy"):
        build_policy(name)


@pytest.mark.parametrize("name", ["static-0", "static-10\n", "static-", "static-x"])
def test_static_names_need_a_positive_whole_k(name):
    with pytest.raises(ValueError, match="unknown policy"):
        validate_policy_name(name)


def test_project_powertrip_estimates_rounds_with_the_systems_time_model():
    from powertrip.config.sites import RoundTimeModel
    from powertrip.selection.scoring import Estimator

    per_site = build_policy("powertrip")
    eq7_system = PolicyContext(round_time_model=RoundTimeModel.AGGREGATE)
    eq7 = build_policy("powertrip", eq7_system)
    paper = build_policy("powertrip-paper", eq7_system)
    assert per_site.config.estimator is Estimator.MAX
    assert eq7.config.estimator is Estimator.AGGREGATE
    assert paper.config.estimator is Estimator.MEAN_POWER  # Algorithm 1 as written, always


def test_the_default_keeps_two_sites_so_it_can_measure_dispersion():
    policy = build_policy("powertrip")
    assert policy.config.min_sites == 2 and policy.wants_direction
    assert build_policy("powertrip-noise").config.min_sites == 1


def test_the_default_scales_k0_and_window_with_the_sites_beyond_a_hundred():
    cfg = build_policy("powertrip").config
    assert cfg.scaled(50) == (10, 5) and cfg.scaled(100) == (10, 5)  # the paper's, unchanged
    assert cfg.scaled(150) == (15, 8) and cfg.scaled(1000) == (100, 50)
    assert build_policy("powertrip-paper").config.scaled(1000) == (10, 5)  # the paper's: absolute


def test_an_explicit_k0_or_window_is_taken_as_given_at_any_site_count():
    from powertrip.config.experiment import GreedyParams

    overrides = GreedyParams(k0=4).overrides()
    policy = build_policy("powertrip", PolicyContext(greedy_overrides=overrides))
    assert policy.config.scaled(1000) == (4, 5)


def test_round_budget_grows_k_only_after_enough_rounds_behind_the_targets_pace():
    from dataclasses import replace as dc_replace

    policy = PowerTripGreedy(dc_replace(PAPER_GREEDY, round_budget=2))
    policy._accuracy.append(0.30)
    policy._budget = (0.50, 10)  # need 0.02 a round
    candidates = np.arange(5, 16, dtype=np.int64)
    gains = 0.0025 * candidates  # k >= 8 projects >= 0.02
    assert policy._within_budget(candidates, gains, 6) == 6  # behind once: wait
    assert policy._within_budget(candidates, gains, 6) == 8  # twice in a row: grow
    policy._budget = (0.30, 10)  # target reached: no need
    assert policy._within_budget(candidates, gains, 6) == 6
    off = PowerTripGreedy(PAPER_GREEDY)
    off._accuracy.append(0.30)
    off._budget = (0.50, 10)
    assert all(off._within_budget(candidates, gains, 6) == 6 for _ in range(5))


def test_the_round_loop_tells_the_policy_its_target_and_rounds_left():
    from powertrip.rounds.clock import EmulatedClock
    from powertrip.rounds.loop import RoundOutcome, TimeModel, run_rounds

    seen = []

    class Recording(StaticTopK):
        def select(self, ctx):
            seen.append((ctx.target_accuracy, ctx.rounds_left))
            return super().select(ctx)

    class Flat:  # trains nothing; accuracy never moves, so every round runs
        def evaluate_initial(self):
            return 0.1, 2.0

        def execute(self, round_index, selected, profile, split_half):
            return RoundOutcome(0.1, 2.0, (1.0, 1.0, 1.0), int(selected.size))

    profile = SiteProfile(np.ones(3), np.ones(3), np.ones(3))
    run_rounds(
        Recording(2), Flat(), lambda t: profile, TimeModel(1.0, 1e3), EmulatedClock(), 0, 0.9, 4
    )
    assert seen == [(0.9, 4), (0.9, 3), (0.9, 2), (0.9, 1)]
