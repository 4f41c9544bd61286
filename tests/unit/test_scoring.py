"""Eq. 8 weights and scores, every site ranking, and the prefix round-time estimators."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.config.sites import RoundTimeModel
from powertrip.selection.scoring import (
    Estimator,
    Ranking,
    ScoreForm,
    WeightSchedule,
    power_to_cost_scores,
    prefix_round_times,
    rank_sites,
    score_weights,
)
from powertrip.sites.profiles import SiteProfile
from powertrip.sites.timing import round_time_s

GB = 1e9


def profile(power, comm, distance=None) -> SiteProfile:
    power = np.asarray(power, dtype=np.float64)
    return SiteProfile(
        power=power,
        comm_s=np.asarray(comm, dtype=np.float64),
        distance_mi=np.asarray(distance if distance is not None else np.zeros(power.size)),
    )


#: Three sites whose Eq. 8 order flips with the update size (hand-worked in the tests):
#: site 0 has full power but the slowest link, site 1 the fastest link, site 2 is in between.
TRADE_OFF = profile(power=[1.0, 0.5, 0.8], comm=[10.0, 2.0, 4.0])

# ------------------------------------------------------------------------- weight schedules


@pytest.mark.parametrize(
    ("update_gb", "alpha", "beta"),
    [
        (1.0, 0.7, 0.3),  # small update: power first
        (1.5, 0.5, 0.5),  # default update: balanced
        (2.0, 0.3, 0.7),  # large update: link first
        (1.25, 0.6, 0.4),  # linear in between: 0.7 - 0.4 * 0.25
        (1.75, 0.4, 0.6),  # 0.7 - 0.4 * 0.75
    ],
)
def test_linear_weights_follow_the_update_size_schedule(update_gb, alpha, beta):
    assert score_weights(update_gb * GB) == pytest.approx((alpha, beta))


@pytest.mark.parametrize(
    ("update_gb", "alpha"),
    [(0.0, 0.7), (0.5, 0.7), (3.0, 0.3), (100.0, 0.3)],  # clipped below 1 GB and above 2 GB
)
def test_linear_weights_are_clipped_outside_1_to_2_gb(update_gb, alpha):
    a, b = score_weights(update_gb * GB, WeightSchedule.LINEAR)
    assert a == pytest.approx(alpha)
    assert a + b == pytest.approx(1.0)


def test_compute_share_weights_are_the_compute_share_of_a_typical_round():
    # tau = 4 s; transfer = 1.5e9 * 8 / 10e9 = 1.2 s; alpha = 4 / 5.2 = 0.769230769
    alpha, beta = score_weights(1.5 * GB, WeightSchedule.COMPUTE_SHARE, 4.0, 10e9)
    assert alpha == pytest.approx(0.769230769)
    assert beta == pytest.approx(0.230769231)


def test_compute_share_weights_shift_to_the_link_as_updates_grow():
    small = score_weights(1.0 * GB, "compute-share", 4.0, 10e9)  # type: ignore[arg-type]
    large = score_weights(2.0 * GB, "compute-share", 4.0, 10e9)  # type: ignore[arg-type]
    # 4 / (4 + 0.8) = 0.8333 and 4 / (4 + 1.6) = 0.7143
    assert small[0] == pytest.approx(4 / 4.8)
    assert large[0] == pytest.approx(4 / 5.6)


@pytest.mark.parametrize(("ideal_s", "median_bps"), [(None, 10e9), (4.0, None), (0.0, 10e9)])
def test_compute_share_weights_need_the_compute_time_and_median_bandwidth(ideal_s, median_bps):
    with pytest.raises(ValueError, match="compute-share weights need"):
        score_weights(1.5 * GB, WeightSchedule.COMPUTE_SHARE, ideal_s, median_bps)


def test_weights_reject_a_negative_update_size():
    with pytest.raises(ValueError, match="update size"):
        score_weights(-1.0)


# ------------------------------------------------------------------------------- Eq. 8 score


def test_difference_score_is_alpha_normalised_power_minus_beta_normalised_comm():
    # Prepare: P~ = P / 1 = [1, 0.5, 0.8]; C~ = C / 10 = [1, 0.2, 0.4]; alpha = 0.7, beta = 0.3
    # S = [0.7 - 0.3, 0.35 - 0.06, 0.56 - 0.12] = [0.4, 0.29, 0.44]
    p, c = TRADE_OFF.power, TRADE_OFF.comm_s

    # Execute
    scores = power_to_cost_scores(p, c, 0.7, 0.3)

    # Assert
    assert scores == pytest.approx([0.4, 0.29, 0.44])


def test_difference_score_normalises_by_the_largest_power_and_comm():
    # halving every power and doubling every comm leaves the normalised score unchanged
    base = power_to_cost_scores(TRADE_OFF.power, TRADE_OFF.comm_s, 0.5, 0.5)
    scaled = power_to_cost_scores(TRADE_OFF.power / 2, TRADE_OFF.comm_s * 2, 0.5, 0.5)
    assert scaled == pytest.approx(base)


def test_difference_score_ranks_like_alpha_p_plus_beta_one_minus_c():
    # Eq. 8: S differs from alpha P~ + beta (1 - C~) by the constant beta
    p, c = TRADE_OFF.power, TRADE_OFF.comm_s
    s = power_to_cost_scores(p, c, 0.3, 0.7)
    alt = 0.3 * p / p.max() + 0.7 * (1 - c / c.max())
    assert alt - s == pytest.approx(np.full(3, 0.7))


def test_exponent_score_is_power_to_the_alpha_over_comm_to_the_beta():
    # alpha = 0.7, beta = 0.3: 1 / 10^0.3 = 0.501187234; 0.5^0.7 / 2^0.3 = 2^-1 = 0.5;
    # 0.8^0.7 / 4^0.3 = 0.564345405
    scores = power_to_cost_scores(
        TRADE_OFF.power, TRADE_OFF.comm_s, 0.7, 0.3, form=ScoreForm.EXPONENT
    )
    assert scores == pytest.approx([0.501187234, 0.5, 0.564345405])


# ---------------------------------------------------------------------------------- rankings


@pytest.mark.parametrize(
    ("update_gb", "expected"),
    [
        (1.0, [2, 0, 1]),  # (0.7, 0.3): S = [0.40, 0.29, 0.44]
        (1.5, [2, 1, 0]),  # (0.5, 0.5): S = [0.00, 0.15, 0.20]
        (2.0, [1, 2, 0]),  # (0.3, 0.7): S = [-0.40, 0.01, -0.04]
    ],
)
def test_power_to_cost_ranking_moves_towards_short_links_as_updates_grow(update_gb, expected):
    # Prepare
    alpha, beta = score_weights(update_gb * GB)

    # Execute
    order = rank_sites(TRADE_OFF, Ranking.POWER_TO_COST, alpha, beta)

    # Assert
    assert order.tolist() == expected
    assert order.dtype == np.int64


def test_power_to_cost_ranking_in_exponent_form():
    # alpha = beta = 0.5: sqrt(P / C) = [sqrt 0.1, sqrt 0.25, sqrt 0.2] = [0.316, 0.5, 0.447]
    order = rank_sites(TRADE_OFF, Ranking.POWER_TO_COST, 0.5, 0.5, form=ScoreForm.EXPONENT)
    assert order.tolist() == [1, 2, 0]


def test_power_ranking_puts_the_highest_power_first():
    # P = [1.0, 0.5, 0.8]
    assert rank_sites(TRADE_OFF, Ranking.POWER).tolist() == [0, 2, 1]


def test_latency_ranking_puts_the_shortest_comm_first():
    # C = [10, 2, 4]
    assert rank_sites(TRADE_OFF, Ranking.LATENCY).tolist() == [1, 2, 0]


@pytest.mark.parametrize(
    ("ideal_s", "expected"),
    [
        (10.0, [2, 0, 1]),  # tau/P + C = [10 + 10, 20 + 2, 12.5 + 4] = [20, 22, 16.5]
        (1.0, [1, 2, 0]),  # [1 + 10, 2 + 2, 1.25 + 4] = [11, 4, 5.25]
    ],
)
def test_round_time_ranking_puts_the_site_with_the_shortest_own_round_first(ideal_s, expected):
    order = rank_sites(TRADE_OFF, Ranking.ROUND_TIME, ideal_compute_s=ideal_s)
    assert order.tolist() == expected


def test_rankings_accept_their_string_values():
    assert rank_sites(TRADE_OFF, "latency").tolist() == [1, 2, 0]  # type: ignore[arg-type]


# -- deterministic tie-breaks: equal keys keep ascending site index


@pytest.mark.parametrize(
    ("ranking", "power", "comm", "expected"),
    [
        # powers 0.5, 0.9, 0.5, 0.9 -> the two 0.9 sites by index, then the two 0.5 sites
        (Ranking.POWER, [0.5, 0.9, 0.5, 0.9], [1.0, 1.0, 1.0, 1.0], [1, 3, 0, 2]),
        # comms 2, 1, 2, 1 -> the two 1 s sites by index, then the two 2 s sites
        (Ranking.LATENCY, [1.0, 1.0, 1.0, 1.0], [2.0, 1.0, 2.0, 1.0], [1, 3, 0, 2]),
        # four identical sites -> identical scores -> index order
        (Ranking.POWER_TO_COST, [0.7] * 4, [3.0] * 4, [0, 1, 2, 3]),
        # tau = 1: 1/0.5 + 0 = 2, 1/1 + 1 = 2, 1/0.25 + 0 = 4, 1/1 + 1 = 2 -> 0, 1, 3 tie, then 2
        (Ranking.ROUND_TIME, [0.5, 1.0, 0.25, 1.0], [0.0, 1.0, 0.0, 1.0], [0, 1, 3, 2]),
    ],
)
def test_rankings_break_ties_by_ascending_site_index(ranking, power, comm, expected):
    assert rank_sites(profile(power, comm), ranking).tolist() == expected


def test_power_to_cost_tie_between_different_sites_is_broken_by_index():
    # alpha = beta = 0.5: site 0 (P~ 1, C~ 1) scores 0; site 1 (P~ 0.5, C~ 0.5) scores 0;
    # site 2 (P~ 0.25, C~ 0.25) scores 0 -> all tie, index order
    tie = profile([1.0, 0.5, 0.25], [8.0, 4.0, 2.0])
    assert rank_sites(tie, Ranking.POWER_TO_COST, 0.5, 0.5).tolist() == [0, 1, 2]


# ------------------------------------------------------------------------ prefix estimators

#: tau = 4 s, three sites in index order: P = [1.0, 0.5, 0.8], C = [1, 3, 2], N = 3
PREFIX = profile([1.0, 0.5, 0.8], [1.0, 3.0, 2.0])
IDENTITY = np.array([0, 1, 2], dtype=np.int64)


def test_mean_power_estimator_is_tau_over_mean_power_plus_max_comm():
    # k=1: 4/1 + 1 = 5; k=2: 4/0.75 + 3 = 8.333333; k=3: 4/(2.3/3) + 3 = 8.217391
    t = prefix_round_times(PREFIX, IDENTITY, 4.0, Estimator.MEAN_POWER)
    assert t == pytest.approx([5.0, 8.333333333, 8.217391304])


def test_max_estimator_is_the_running_max_of_each_sites_own_round():
    # own rounds 4/1 + 1 = 5, 4/0.5 + 3 = 11, 4/0.8 + 2 = 7 -> running max 5, 11, 11
    t = prefix_round_times(PREFIX, IDENTITY, 4.0, Estimator.MAX)
    assert t == pytest.approx([5.0, 11.0, 11.0])


def test_aggregate_estimator_is_n_tau_over_summed_power_plus_max_comm():
    # N tau = 12: k=1: 12/1 + 1 = 13; k=2: 12/1.5 + 3 = 11; k=3: 12/2.3 + 3 = 8.217391
    t = prefix_round_times(PREFIX, IDENTITY, 4.0, Estimator.AGGREGATE)
    assert t == pytest.approx([13.0, 11.0, 8.217391304])


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        # order [2, 0, 1]: P = [0.8, 1, 0.5], C = [2, 1, 3]
        (Estimator.MEAN_POWER, [7.0, 6.444444444, 8.217391304]),  # 4/.8+2, 4/.9+2, 4/(2.3/3)+3
        (Estimator.MAX, [7.0, 7.0, 11.0]),  # own rounds 7, 5, 11
        (Estimator.AGGREGATE, [17.0, 8.666666667, 8.217391304]),  # 12/.8+2, 12/1.8+2, 12/2.3+3
    ],
)
def test_estimators_follow_the_given_order(estimator, expected):
    order = np.array([2, 0, 1], dtype=np.int64)
    assert prefix_round_times(PREFIX, order, 4.0, estimator) == pytest.approx(expected)


def test_max_and_aggregate_estimators_agree_with_the_ground_truth_round_time():
    # Prepare
    order = np.array([2, 0, 1], dtype=np.int64)
    max_est = prefix_round_times(PREFIX, order, 4.0, Estimator.MAX)
    agg_est = prefix_round_times(PREFIX, order, 4.0, Estimator.AGGREGATE)

    for k in (1, 2, 3):
        top = order[:k]
        # Execute
        per_site = round_time_s(
            RoundTimeModel.PER_SITE_MAX, 4.0, PREFIX.power[top], PREFIX.comm_s[top]
        )
        aggregate = round_time_s(
            RoundTimeModel.AGGREGATE, 4.0, PREFIX.power[top], PREFIX.comm_s[top], total_sites=3
        )
        # Assert
        assert max_est[k - 1] == pytest.approx(per_site)
        assert agg_est[k - 1] == pytest.approx(aggregate)
