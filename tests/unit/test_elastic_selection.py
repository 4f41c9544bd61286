"""PowerTrip inside the curtailment system (docs/curtailment.md): Eq. 8 with a carbon term
ranks the available sites, Algorithm 1 picks how many with wall-clock round times."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.curtailment.wall_clock import WallClockRounds
from powertrip.selection.base import RoundContext, RoundFeedback
from powertrip.selection.carbon_greedy import CarbonRanking, CarbonSiteProfile, WallClockGreedy
from powertrip.selection.scoring import Ranking, rank_sites, score_weights
from powertrip.sites.profiles import SiteProfile

ROUNDS = WallClockRounds(step_s=64.08, round_min_s=600.0, overhead_s=45.0)


def ctx(power, comm, intensity, round_index: int = 1, update_bytes: float = 1.1e9):
    profile = CarbonSiteProfile(
        power=np.asarray(power, dtype=float),
        comm_s=np.asarray(comm, dtype=float),
        distance_mi=np.zeros(len(power)),
        intensity=np.asarray(intensity, dtype=float),
    )
    return RoundContext(round_index, 0.0, profile, 600.0, update_bytes, np.random.default_rng(0))


def test_without_carbon_weight_the_order_is_eq8():
    c = ctx([0.9, 0.3, 0.6, 0.5], [4.0, 1.0, 2.0, 9.0], [10, 900, 500, 20])
    alpha, beta = score_weights(c.update_bytes)

    order = CarbonRanking(0.0).order(c)

    assert order.tolist() == rank_sites(c.profile, Ranking.POWER_TO_COST, alpha, beta).tolist()


def test_the_carbon_term_puts_a_clean_site_ahead_of_a_stronger_dirty_one():
    # Site 0: full power on a dirty grid (e.g. in its hysteresis tail); site 1: 70% but clean.
    c = ctx([1.0, 0.7], [1.0, 1.0], [450.0, 5.0])

    assert CarbonRanking(0.0).order(c).tolist() == [0, 1]
    assert CarbonRanking(0.5).order(c).tolist() == [1, 0]


def test_the_carbon_term_is_the_weighted_intensity_over_the_pools_dirtiest_site():
    # Eq. 8 at 1.1 GB (alpha 0.66, beta 0.34): S = [0.66 - 0.34, 0.462 - 0.34] = [0.32, 0.122];
    # intensity / 450 = [1, 1/90]; gamma 0.5: 0.5 * S - 0.5 * I~
    c = ctx([1.0, 0.7], [1.0, 1.0], [450.0, 5.0])
    expected = [0.5 * 0.32 - 0.5, 0.5 * 0.122 - 0.5 / 90]
    assert CarbonRanking(0.5).scores(c).tolist() == pytest.approx(expected)


def test_a_pool_with_no_emissions_keeps_the_eq8_order_scaled_by_one_minus_gamma():
    c = ctx([0.5, 1.0], [1.0, 1.0], [0.0, 0.0])
    eq8 = CarbonRanking(0.0).scores(c)
    assert CarbonRanking(0.5).scores(c).tolist() == pytest.approx((0.5 * eq8).tolist())
    assert CarbonRanking(0.5).order(c).tolist() == [1, 0]


@pytest.mark.parametrize("carbon_weight", [0.0, 0.5])
def test_the_carbon_ranking_refuses_a_profile_without_intensities(carbon_weight):
    plain = SiteProfile(power=np.ones(2), comm_s=np.ones(2), distance_mi=np.zeros(2))
    c = RoundContext(1, 0.0, plain, 600.0, 1.1e9, np.random.default_rng(0))
    with pytest.raises(TypeError, match="needs a CarbonSiteProfile.*got SiteProfile"):
        CarbonRanking(carbon_weight).order(c)


def test_carbon_weight_outside_the_unit_interval_is_refused():
    with pytest.raises(ValueError, match="carbon weight"):
        CarbonRanking(1.5)


def test_wall_clock_estimate_is_overhead_plus_the_minimum_to_a_step_boundary_plus_upload():
    c = ctx([1.0, 0.15], [2.0, 3.0], [0, 0])
    greedy = WallClockGreedy(ROUNDS)

    times = greedy.prefix_times(c, np.array([0, 1]))

    fast = 45.0 + 10 * 64.08 + 2.0  # ceil(600 / 64.08) = 10 steps
    slow = 45.0 + 2 * 64.08 / 0.15 + 3.0  # one step takes 427 s: the second ends at 854 s
    assert times.tolist() == pytest.approx([fast, slow])


def _feedback(r: int, k: int, accuracy: float) -> RoundFeedback:
    return RoundFeedback(r, np.arange(k), 690.0, accuracy, accuracy - 0.02)


def test_algorithm_1_drops_a_straggler_whose_last_step_overruns_the_round():
    # Two full-power sites and one at 15%: with it, every round lasts 900 s instead of 686 s,
    # more than the log gain of a third site pays for; after the patience it is left out.
    greedy = WallClockGreedy(ROUNDS)
    chosen = []
    for r in range(1, 6):
        chosen.append(greedy.select(ctx([1.0, 1.0, 0.15], [1.0, 1.0, 1.0], [0, 0, 0], r)))
        greedy.observe(_feedback(r, len(chosen[-1]), 0.1 + 0.02 * r))

    assert len(chosen[0]) == 3  # k0 = 10 clipped to the pool
    assert sorted(chosen[-1].tolist()) == [0, 1]


def test_the_pool_clips_k():
    greedy = WallClockGreedy(ROUNDS)

    assert greedy.select(ctx([1.0], [1.0], [0.0])).tolist() == [0]
