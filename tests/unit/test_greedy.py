"""Algorithm 1 (spec §3.2-§3.5): the greedy, bottom-up site-count policy.

Most tests rank by latency over eight full-power sites with tau = 1 s, so the mean-power
estimate is T_hat(k) = 1 + max_{j<=k} C_j and, with the log gain, the efficiency is
E(k') = trend * log(1+k') / log(1+k) / (1 + max_{j<=k'} C_j). The comm profiles below shape E:

- FLAT  (all C = 0):            E grows with k' -> the argmax is the top of the window
- PEAK4 (C = 0 x4, then 50):    E(4) = log 5 = 1.609 beats E(5) = log 6 / 51 -> argmax 4
- STEEP (C = 0, 10, 100, ...):  E = [0.693, 0.0999, 0.0137, 0.0016, ...] falls -> argmax lowest
- DIP   (C = 0 x2, then 0.5):   E ~ [0.693, 1.099, 0.924, 1.073, 1.195, 1.297, ...]: a local
                                maximum at 2, then a higher one further out
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from powertrip.fedavg import StreamingFedAvg
from powertrip.selection.base import RankingConfig, RoundContext, RoundFeedback
from powertrip.selection.greedy import GainModel, GreedyConfig, PowerTripGreedy, SearchMode
from powertrip.selection.scoring import Estimator, Ranking
from powertrip.sites import SiteProfile

N = 8
FLAT = [0.0] * N
PEAK4 = [0.0] * 4 + [50.0] * 4
STEEP = [0.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7]
DIP = [0.0, 0.0] + [0.5] * 6
BY_LATENCY = RankingConfig(ranking=Ranking.LATENCY)


def profile(comm, power=None) -> SiteProfile:
    comm = np.asarray(comm, dtype=np.float64)
    power = np.ones(comm.size) if power is None else np.asarray(power, dtype=np.float64)
    return SiteProfile(power=power, comm_s=comm, distance_mi=np.zeros(comm.size))


def ctx(comm=FLAT, power=None, rnd: int = 1) -> RoundContext:
    return RoundContext(
        round=rnd,
        now_s=0.0,
        profile=profile(comm, power),
        ideal_compute_s=1.0,
        update_bytes=1.5e9,
        rng=np.random.default_rng(0),
    )


def greedy(**overrides) -> PowerTripGreedy:
    params = {"ranking": BY_LATENCY, **overrides}
    return PowerTripGreedy(GreedyConfig(**params))


def feedback(prev: float, acc: float, duration: float = 100.0, rnd: int = 1, **noise):
    return RoundFeedback(rnd, np.arange(1), duration, acc, prev, **noise)


def run(policy: PowerTripGreedy, comms, accuracies=None, duration: float = 100.0) -> list[int]:
    """One select + observe per entry of ``comms``; accuracy rises 0.01 a round unless given."""
    accuracies = accuracies or [0.1 + 0.01 * r for r in range(len(comms) + 1)]
    for r, comm in enumerate(comms, start=1):
        selected = policy.select(ctx(comm, rnd=r))
        policy.observe(RoundFeedback(r, selected, duration, accuracies[r], accuracies[r - 1]))
    return policy.k_history


# --------------------------------------------------------------------------- start and grow


def test_first_round_uses_the_k0_best_ranked_sites():
    # Prepare: comm 5, 1, 4, 2, 3, ... -> latency order 1, 3, 4, 2, 0, ...
    policy = greedy(k0=3)

    # Execute
    selected = policy.select(ctx([5.0, 1.0, 4.0, 2.0, 3.0, 6.0, 7.0, 8.0]))

    # Assert
    assert selected.tolist() == [1, 3, 4]
    assert policy.k_history == [3]


def test_k0_above_the_number_of_sites_starts_with_every_site():
    policy = greedy(k0=50)
    assert policy.select(ctx()).size == N
    assert policy.k_history == [N]


def test_without_feedback_the_count_does_not_move():
    # select twice with no observe in between: nothing to learn from
    policy = greedy(k0=3)
    policy.select(ctx(FLAT))
    policy.select(ctx(FLAT))
    assert policy.k_history == [3, 3]


def test_grows_immediately_to_the_argmax_within_the_window():
    # Prepare: k0 = 1, window 5 -> candidates 1..6; under PEAK4 the argmax is 4, not 2 or 6
    policy = greedy(k0=1, window=5)

    # Execute
    history = run(policy, [PEAK4, PEAK4])

    # Assert: one step straight to 4
    assert history == [1, 4]


def test_growth_is_limited_to_the_window_each_round():
    # FLAT: the argmax is always the window's top, k + 2, capped at N = 8
    history = run(greedy(k0=2, window=2), [FLAT] * 5)
    assert history == [2, 4, 6, 8, 8]


def test_each_round_takes_the_top_k_of_the_current_ranking():
    # Prepare: k stays 2 (window 0 on PEAK-at-2 profiles); the latency order changes in round 2
    policy = greedy(k0=2, window=0)
    first = [0.0, 0.0, 50.0, 50.0, 50.0, 50.0, 50.0, 50.0]  # order 0, 1, ... ; argmax 2
    second = [50.0, 50.0, 50.0, 50.0, 50.0, 50.0, 0.0, 0.0]  # order 6, 7, ... ; argmax 2

    # Execute
    a = policy.select(ctx(first))
    policy.observe(feedback(0.1, 0.2))
    b = policy.select(ctx(second))

    # Assert
    assert a.tolist() == [0, 1]
    assert b.tolist() == [6, 7]
    assert policy.k_history == [2, 2]


# --------------------------------------------------------------------------- patience


def test_shrinks_only_after_patience_consecutive_votes():
    # k = 4, window 5 covers 1..8; STEEP wants 1. Votes in rounds 2, 3, 4; the third one shrinks.
    history = run(greedy(k0=4, window=5, patience=3), [STEEP] * 5)
    assert history == [4, 4, 4, 1, 1]


def test_a_hold_vote_resets_the_shrink_counter():
    # rounds 2-3 vote to shrink (2 votes), round 4 under PEAK4 holds at 4 (reset), rounds 5-7
    # vote again: only the third new vote (round 7) shrinks
    comms = [STEEP, STEEP, STEEP, PEAK4, STEEP, STEEP, STEEP]
    history = run(greedy(k0=4, window=5, patience=3), comms)
    assert history == [4, 4, 4, 4, 4, 4, 1]


def test_a_grow_vote_resets_the_shrink_counter():
    # window 0: STEEP votes for 1, FLAT for 8. Two shrink votes, then a growth to 8 (reset),
    # then three fresh votes are needed before shrinking to 1
    comms = [FLAT, STEEP, STEEP, FLAT, STEEP, STEEP, STEEP]
    history = run(greedy(k0=3, window=0, patience=3), comms)
    assert history == [3, 3, 3, 8, 8, 8, 1]


def test_the_shrink_counter_restarts_after_a_shrink():
    # window 1, patience 2 under STEEP: every round votes k - 1; each shrink needs 2 new votes
    history = run(greedy(k0=6, window=1, patience=2), [STEEP] * 7)
    assert history == [6, 6, 5, 5, 4, 4, 3]


def test_patience_one_shrinks_at_the_first_vote():
    history = run(greedy(k0=6, window=0, patience=1), [STEEP] * 2)
    assert history == [6, 1]


def test_ties_go_to_the_smaller_count():
    # the noise-scale gain with no dispersion data is flat (B = 0), and FLAT makes T_hat = 1 for
    # every k, so E is identical for candidates 1..5: the smallest, 1, wins (a shrink vote)
    policy = greedy(k0=3, window=2, patience=1, gain=GainModel.NOISE_SCALE)
    assert run(policy, [FLAT, FLAT]) == [3, 1]


# ------------------------------------------------------------------------ window and search


def test_window_zero_searches_every_count():
    # FLAT from k = 1: window 0 jumps to N = 8 at once, window 2 only to 3
    assert run(greedy(k0=1, window=0), [FLAT] * 2) == [1, 8]
    assert run(greedy(k0=1, window=2), [FLAT] * 2) == [1, 3]


def test_window_argmax_finds_the_best_count_beyond_a_local_maximum():
    # DIP from k = 1, window 5 (candidates 1..6): E(6) = log 7 / 1.5 = 1.297 is the best
    assert run(greedy(k0=1, window=5), [DIP] * 2) == [1, 6]


def test_incremental_prefix_stops_at_the_first_non_improvement():
    # DIP from k = 1, window 5: E(2) = 1.099 > E(1) = 0.693, but E(3) = 0.924 < E(2): stop at 2.
    # The measured efficiency (0.01 per 100 s = 1e-4/s) is below every projected E (>= 0.01).
    policy = greedy(k0=1, window=5, search=SearchMode.INCREMENTAL_PREFIX)
    assert run(policy, [DIP] * 2) == [1, 2]


def test_incremental_prefix_adds_a_site_only_if_it_beats_the_measured_efficiency():
    # Prepare: accuracy 0.3 -> 0.8 in 0.1 s: measured E = 5 / s, above every projected
    # E(k') = 0.5 * log(1+k') / log 2 / 1 <= 0.5 * log 7 / log 2 = 1.40: no site is worth adding
    prefix = greedy(k0=1, window=5, search=SearchMode.INCREMENTAL_PREFIX)
    argmax = greedy(k0=1, window=5)

    # Execute
    for policy in (prefix, argmax):
        policy.select(ctx(FLAT))
        policy.observe(feedback(0.3, 0.8, duration=0.1))
        policy.select(ctx(FLAT))

    # Assert: the window argmax ignores the measured efficiency and goes to the top, 6
    assert prefix.k_history == [1, 1]
    assert argmax.k_history == [1, 6]


def test_incremental_prefix_starts_at_k_minus_window_and_obeys_patience():
    # STEEP, k = 4, window 2: the scan starts at 2 and E(3) < E(2) stops it at 2, a shrink vote;
    # with patience 2 the second vote shrinks
    policy = greedy(k0=4, window=2, patience=2, search=SearchMode.INCREMENTAL_PREFIX)
    assert run(policy, [STEEP] * 3) == [4, 4, 2]


def test_the_configured_estimator_drives_the_choice():
    # Prepare: P = [1, 0.1, 1, 1, 1, 1, 1, 1], no comm. Mean power forgives the slow site 1
    # (T_hat(8) = 1 / 0.8875 = 1.127 -> E(8) = log 9 / 1.127 = 1.95 is best), the straggler-exact
    # max estimator does not (T_hat(k >= 2) = 10 -> E(1) = 0.693 beats E(8) = 0.22)
    power = [1.0, 0.1, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    histories = {}
    for estimator in (Estimator.MEAN_POWER, Estimator.MAX):
        policy = greedy(k0=2, window=0, patience=1, estimator=estimator)

        # Execute
        policy.select(ctx(FLAT, power))
        policy.observe(feedback(0.1, 0.2))
        policy.select(ctx(FLAT, power))
        histories[estimator] = policy.k_history

    # Assert
    assert histories[Estimator.MEAN_POWER] == [2, 8]
    assert histories[Estimator.MAX] == [2, 1]


# --------------------------------------------------------------------------------- log gain


def test_log_gain_rescales_the_trend_per_log_worker():
    # Prepare: one round 0.2 -> 0.3, trend 0.1; current k = 3
    policy = greedy()
    policy.observe(feedback(0.2, 0.3))

    # Execute
    gain = policy.projected_gain(np.array([1, 3, 7]), 3)

    # Assert: 0.1 * log(1+k') / log 4 = 0.1 * [0.5, 1, 1.5]
    assert gain == pytest.approx([0.05, 0.1, 0.15])


def test_trend_is_the_mean_gain_over_the_last_m_rounds():
    # Prepare: m = 3; accuracy 0.1, 0.2, 0.4, 0.5, 0.9
    policy = greedy(trend_rounds=3)
    policy.observe(feedback(0.1, 0.2))
    policy.observe(feedback(0.2, 0.4))
    after_two = policy.projected_gain(np.array([5]), 5)[0]
    policy.observe(feedback(0.4, 0.5))
    policy.observe(feedback(0.5, 0.9))

    # Execute
    after_four = policy.projected_gain(np.array([5]), 5)[0]

    # Assert: (0.4 - 0.1) / 2 = 0.15 over two rounds; (0.9 - 0.2) / 3 = 0.2333 over the last 3
    assert after_two == pytest.approx(0.15)
    assert after_four == pytest.approx(0.7 / 3)


def test_gain_is_floored_at_epsilon_when_accuracy_falls():
    # Prepare: accuracy falls 0.5 -> 0.4 (trend -0.1), floor 1e-4; k = 3
    policy = greedy(gain_floor=1e-4)
    policy.observe(feedback(0.5, 0.4))

    # Execute
    gain = policy.projected_gain(np.array([1, 3, 7]), 3)

    # Assert: positive, epsilon * [0.5, 1, 1.5], so a larger k still projects a larger gain
    assert gain == pytest.approx([0.5e-4, 1e-4, 1.5e-4])


def test_gain_is_epsilon_before_any_feedback_and_after_a_flat_round():
    policy = greedy(gain_floor=0.01)
    assert policy.projected_gain(np.array([4]), 4) == pytest.approx([0.01])
    policy.observe(feedback(0.4, 0.4))
    assert policy.projected_gain(np.array([4]), 4) == pytest.approx([0.01])


@pytest.mark.parametrize(
    "accuracies",
    [
        [0.10 + 0.05 * r for r in range(12)],  # steady gains
        [0.10, 0.60, 0.70, 0.72, 0.73, 0.735, 0.74, 0.741, 0.742, 0.7425, 0.743, 0.7431],  # flat
        [0.90 - 0.02 * r for r in range(12)],  # falling: every trend is floored at epsilon
        [0.1, 0.3, 0.2, 0.5, 0.4, 0.45, 0.3, 0.6, 0.55, 0.7, 0.65, 0.8],  # noisy
    ],
    ids=["steady", "plateau", "falling", "noisy"],
)
def test_with_the_log_gain_the_chosen_k_does_not_depend_on_the_accuracy_trend(accuracies):
    # spec §3.5: E(k') = trend * g(k') / g(k) / T_hat(k'); the positive factor trend cancels in
    # the argmax. Worked path (k0 = 1, window 2, patience 2):
    #   PEAK4: 1 -> 3 (cands 1..3) -> 4 (cands 1..5) -> 4 (hold)
    #   STEEP: vote, shrink to 2 (cands 2..6) -> vote, shrink to 1 (cands 1..4)
    #   FLAT:  3 -> 5 -> 7
    comms = [PEAK4] * 4 + [STEEP] * 4 + [FLAT] * 3
    history = run(greedy(k0=1, window=2, patience=2), comms, accuracies)
    assert history == [1, 3, 4, 4, 4, 2, 2, 1, 3, 5, 7]


# ------------------------------------------------------------------------ kappa-headroom gain


def test_kappa_headroom_gain_grows_as_per_round_gains_flatten():
    # Prepare: gains 0.3 then 0.1 -> trend (0.4 - 0) / 2 = 0.2, best single gain 0.3,
    # headroom = 1 - 0.2 / 0.3 = 1/3; k = 3
    policy = greedy(gain=GainModel.KAPPA_HEADROOM, kappa=1.0)
    policy.observe(feedback(0.0, 0.3))
    policy.observe(feedback(0.3, 0.4))

    # Execute
    gain = policy.projected_gain(np.array([1, 3, 7]), 3)

    # Assert: 0.2 * (1 + (1/3) * ln((1+k') / 4)) = 0.2 * [1 - ln2/3, 1, 1 + ln2/3]
    third_ln2 = math.log(2) / 3
    assert gain == pytest.approx([0.2 * (1 - third_ln2), 0.2, 0.2 * (1 + third_ln2)])
    assert gain == pytest.approx([0.1537901880, 0.2, 0.2462098120])


def test_kappa_headroom_gain_is_flat_while_gains_are_at_their_best():
    # steady 0.1 per round: trend == best gain, headroom 0, extra sites project no extra gain
    policy = greedy(gain=GainModel.KAPPA_HEADROOM)
    policy.observe(feedback(0.0, 0.1))
    policy.observe(feedback(0.1, 0.2))
    assert policy.projected_gain(np.array([1, 3, 7]), 3) == pytest.approx([0.1, 0.1, 0.1])


def test_kappa_zero_turns_off_the_headroom_term():
    policy = greedy(gain=GainModel.KAPPA_HEADROOM, kappa=0.0)
    policy.observe(feedback(0.0, 0.3))
    policy.observe(feedback(0.3, 0.4))
    assert policy.projected_gain(np.array([1, 3, 7]), 3) == pytest.approx([0.2, 0.2, 0.2])


def test_kappa_scales_the_headroom_term():
    # kappa = 2: 0.2 * (1 + 2 * (1/3) * ln 2) = 0.292419624 at k' = 7
    policy = greedy(gain=GainModel.KAPPA_HEADROOM, kappa=2.0)
    policy.observe(feedback(0.0, 0.3))
    policy.observe(feedback(0.3, 0.4))
    assert policy.projected_gain(np.array([7]), 3) == pytest.approx([0.292419624])


# ------------------------------------------------------------------------- noise-scale gain


def dispersion_feedback(signal: float, trace: float, k_eff: float) -> RoundFeedback:
    """Feedback whose statistics are the expectations for |G|^2 = signal, tr(Sigma) = trace:
    weighted mean |d_i|^2 = |G|^2 + tr(Sigma), |mean d|^2 = |G|^2 + tr(Sigma) / k_eff."""
    return feedback(
        0.2,
        0.3,
        mean_sq_norm=signal + trace,
        sq_norm_of_mean=signal + trace / k_eff,
        effective_sites=k_eff,
    )


@pytest.mark.parametrize(
    ("signal", "trace", "k_eff", "noise_scale"),
    [
        (2.0, 6.0, 4.0, 3.0),  # mean |d|^2 = 8, |mean|^2 = 3.5 -> tr = 4.5 / 0.75 = 6, |G|^2 = 2
        (1.0, 10.0, 2.5, 10.0),  # 11 and 5 -> tr = 6 / 0.6 = 10, |G|^2 = 5 - 4 = 1
        (4.0, 1.0, 10.0, 0.25),  # 5 and 4.1 -> tr = 0.9 / 0.9 = 1, |G|^2 = 4.1 - 0.1 = 4
    ],
)
def test_noise_scale_recovers_trace_over_signal_from_constructed_dispersion(
    signal, trace, k_eff, noise_scale
):
    policy = greedy(gain=GainModel.NOISE_SCALE)
    policy.observe(dispersion_feedback(signal, trace, k_eff))
    assert policy.noise_scale() == pytest.approx(noise_scale)


def test_noise_scale_recovers_b_from_real_fedavg_dispersion():
    # Prepare: 100 sites per round, d_i = G + N(0, 0.12 I) in 50 dims, unequal sample weights:
    # |G|^2 = 50 * 0.2^2 = 2, tr(Sigma) = 50 * 0.12 = 6, so B = 3
    rng = np.random.default_rng(0)
    policy = greedy(gain=GainModel.NOISE_SCALE, noise_smoothing=0.9)
    g = np.full(50, 0.2)

    # Execute
    for r in range(1, 61):
        agg = StreamingFedAvg({"w": np.zeros(50)})
        for weight in rng.uniform(1.0, 3.0, size=100):
            agg.add({"w": g + math.sqrt(0.12) * rng.standard_normal(50)}, float(weight))
        mean_sq, sq_mean, k_eff = agg.dispersion()
        policy.observe(
            feedback(
                0.2,
                0.3,
                rnd=r,
                mean_sq_norm=mean_sq,
                sq_norm_of_mean=sq_mean,
                effective_sites=k_eff,
            )
        )

    # Assert
    assert policy.noise_scale() == pytest.approx(3.0, rel=0.1)


def test_noise_scale_statistics_are_smoothed_separately():
    # EMA weight 0.7 on history: tr = 0.7 * 6 + 0.3 * 12 = 7.8, |G|^2 = 0.7 * 2 + 0.3 * 1 = 1.7
    policy = greedy(gain=GainModel.NOISE_SCALE, noise_smoothing=0.7)
    policy.observe(dispersion_feedback(2.0, 6.0, 4.0))
    policy.observe(dispersion_feedback(1.0, 12.0, 4.0))
    assert policy.noise_scale() == pytest.approx(7.8 / 1.7)


@pytest.mark.parametrize(
    "noise",
    [
        {},  # no dispersion reported
        {"mean_sq_norm": 8.0, "sq_norm_of_mean": 3.5, "effective_sites": 1.0},  # one site
        {"mean_sq_norm": 8.0, "sq_norm_of_mean": 3.5, "effective_sites": None},
    ],
    ids=["missing", "single-site", "no-k-eff"],
)
def test_noise_scale_ignores_rounds_that_cannot_measure_dispersion(noise):
    policy = greedy(gain=GainModel.NOISE_SCALE)
    policy.observe(feedback(0.2, 0.3, **noise))
    assert policy.noise_scale() == 0.0
    # with B = 0 the gain k'/(k'+B) is flat: the trend for every candidate
    assert policy.projected_gain(np.array([1, 4, 12]), 4) == pytest.approx([0.1, 0.1, 0.1])


def test_noise_scale_gain_is_the_averaging_benefit_k_over_k_plus_b():
    # Prepare: B = 3, trend 0.1, k = 4
    policy = greedy(gain=GainModel.NOISE_SCALE)
    policy.observe(dispersion_feedback(2.0, 6.0, 4.0))

    # Execute
    gain = policy.projected_gain(np.array([1, 4, 12]), 4)

    # Assert: 0.1 * (k'/(k'+3)) / (4/7) = 0.1 * [0.25, 4/7, 0.8] * 7/4 = [0.04375, 0.1, 0.14]
    assert gain == pytest.approx([0.04375, 0.1, 0.14])


# ----------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("k0", 0),
        ("window", -1),
        ("patience", 0),
        ("trend_rounds", 0),
        ("gain_floor", 0.0),
        ("gain_floor", -1e-4),
        ("kappa", -0.5),
        ("noise_smoothing", 1.0),
        ("noise_smoothing", -0.1),
    ],
)
def test_invalid_greedy_config_values_are_rejected_by_name(field, value):
    with pytest.raises(ValueError, match=f"invalid greedy policy parameter.*{field}"):
        GreedyConfig(**{field: value})


def test_every_invalid_greedy_parameter_is_named_at_once():
    with pytest.raises(ValueError, match="k0, window, patience"):
        GreedyConfig(k0=0, window=-1, patience=0)


def test_boundary_greedy_config_values_are_accepted():
    cfg = GreedyConfig(k0=1, window=0, patience=1, trend_rounds=1, kappa=0.0, noise_smoothing=0.0)
    assert (cfg.k0, cfg.window, cfg.patience) == (1, 0, 1)


def test_split_half_gain_fits_loss_against_sites_averaged():
    # m = 8 sites give L = 1.5, their every-other half (m = 4) gives 1.6, the round began at 2.0:
    # c = 0.1 / (1/4 - 1/8) = 0.8, L_inf = 1.5 - 0.8/8 = 1.4, noise-free progress 0.6,
    # b = 0.8 / 0.6 = 4/3; averaging 16 instead of 8 keeps (1 - b/16) / (1 - b/8) = 1.1x.
    policy = PowerTripGreedy(GreedyConfig(gain=GainModel.SPLIT_HALF, min_sites=2))
    policy.observe(
        RoundFeedback(
            1,
            np.arange(8),
            10.0,
            0.5,
            0.4,
            effective_sites=8.0,
            loss=1.5,
            previous_loss=2.0,
            half_loss=1.6,
            half_sites=4.0,
        )
    )
    assert policy.averaging_scale() == pytest.approx(4 / 3)
    gain = policy.projected_gain(np.array([8, 16]), k=8)
    assert gain[1] / gain[0] == pytest.approx(1.1)


def test_split_half_policy_never_drops_below_two_sites():
    # k0 = 1 is lifted to the floor: one site gives no half to compare against
    profile = SiteProfile(power=np.full(5, 0.5), comm_s=np.ones(5), distance_mi=np.ones(5))
    ctx = RoundContext(1, 0.0, profile, 10.0, 1.5e9, np.random.default_rng(0))
    policy = PowerTripGreedy(GreedyConfig(gain=GainModel.SPLIT_HALF, min_sites=2, k0=1))
    assert len(policy.select(ctx)) == 2


# ----------------------------------------------------------------- directional noise scale


def directional_feedback(
    signal: float, trace: float, signal_par: float, noise_par: float, k_eff: float
) -> RoundFeedback:
    """Expected statistics for |G|^2, tr(Sigma) and, along u, (G.u)^2 and u'Sigma u."""
    return feedback(
        0.2,
        0.3,
        mean_sq_norm=signal + trace,
        sq_norm_of_mean=signal + trace / k_eff,
        effective_sites=k_eff,
        mean_proj=math.sqrt(signal_par + noise_par / k_eff),
        mean_sq_proj=signal_par + noise_par,
    )


def test_directional_noise_scale_uses_the_projections_only():
    # Prepare: B = 12 / 2 = 6 overall; along u: (G.u)^2 = 1.5, u'Sigma u = 0.75 -> B_par = 0.5
    #   mean p^2 = 2.25, (mean p)^2 = 1.5 + 0.75 / 4 = 1.6875
    #   noise = (2.25 - 1.6875) / 0.75 = 0.75, signal = 1.6875 - 0.75 / 4 = 1.5
    policy = greedy(gain=GainModel.NOISE_DIRECTIONAL)

    # Execute
    policy.observe(directional_feedback(2.0, 12.0, 1.5, 0.75, 4.0))

    # Assert
    assert policy.noise_scale() == pytest.approx(6.0)
    assert policy.noise_scale(directional=True) == pytest.approx(0.5)
    # gain k'/(k'+0.5) relative to k = 4 (4 / 4.5), trend 0.1:
    #   k'=1: 0.1 * (1 / 1.5) * (4.5 / 4) = 0.075;  k'=2: 0.1 * 0.8 * 1.125 = 0.09
    assert policy.projected_gain(np.array([1, 2, 4]), 4) == pytest.approx([0.075, 0.09, 0.1])
    assert policy.wants_direction
    assert not greedy(gain=GainModel.NOISE_SCALE).wants_direction


def test_directional_noise_scale_falls_back_to_b_before_the_first_projection():
    policy = greedy(gain=GainModel.NOISE_DIRECTIONAL)
    policy.observe(dispersion_feedback(2.0, 6.0, 4.0))  # round 1: no previous delta yet
    assert policy.noise_scale(directional=True) == pytest.approx(3.0)


def test_directional_statistics_are_smoothed_separately():
    # EMA 0.7: u'Su = 0.7 * 0.75 + 0.3 * 3 = 1.425, (G.u)^2 = 0.7 * 1.5 + 0.3 * 1 = 1.35
    policy = greedy(gain=GainModel.NOISE_DIRECTIONAL, noise_smoothing=0.7)
    policy.observe(directional_feedback(2.0, 12.0, 1.5, 0.75, 4.0))
    policy.observe(directional_feedback(2.0, 12.0, 1.0, 3.0, 4.0))
    assert policy.noise_scale(directional=True) == pytest.approx(1.425 / 1.35)


def test_directional_noise_scale_from_real_fedavg_projections():
    # Prepare: d_i = G + N(0, 0.12 I) in 50 dims, |G|^2 = 2 -> B = 6 / 2 = 3; projected on
    # u = G / |G|: (G.u)^2 = 2 and u'Sigma u = 0.12 -> B_par = 0.06, isotropic noise mostly
    # lies off the direction of travel
    rng = np.random.default_rng(0)
    policy = greedy(gain=GainModel.NOISE_DIRECTIONAL, noise_smoothing=0.9)
    g = np.full(50, 0.2)

    # Execute
    for r in range(1, 61):
        agg = StreamingFedAvg({"w": np.zeros(50)}, direction={"w": g})
        for weight in rng.uniform(1.0, 3.0, size=100):
            agg.add({"w": g + math.sqrt(0.12) * rng.standard_normal(50)}, float(weight))
        mean_sq, sq_mean, k_eff = agg.dispersion()
        mean_proj, mean_sq_proj = agg.projection()
        policy.observe(
            feedback(
                0.2,
                0.3,
                rnd=r,
                mean_sq_norm=mean_sq,
                sq_norm_of_mean=sq_mean,
                effective_sites=k_eff,
                mean_proj=mean_proj,
                mean_sq_proj=mean_sq_proj,
            )
        )

    # Assert
    assert policy.noise_scale() == pytest.approx(3.0, rel=0.1)
    assert policy.noise_scale(directional=True) == pytest.approx(0.06, rel=0.2)


# ------------------------------------------------------------------ split-half on accuracy


def test_split_half_accuracy_fits_the_validation_error_not_the_loss():
    # m = 8 sites reach accuracy 0.70 (error 0.30), their half (m = 4) 0.68 (error 0.32), the
    # round began at 0.60 (error 0.40): c = 0.02 / (1/4 - 1/8) = 0.16, E_inf = 0.30 - 0.16/8
    # = 0.28, noise-free progress 0.40 - 0.28 = 0.12, b = 0.16 / 0.12 = 4/3. The losses would
    # give b = 4/3 * 10 (half_loss 2.5): they must be ignored.
    policy = PowerTripGreedy(GreedyConfig(gain=GainModel.SPLIT_HALF_ACCURACY, min_sites=2))
    assert policy.wants_split_half
    policy.observe(
        RoundFeedback(
            1,
            np.arange(8),
            10.0,
            0.70,
            0.60,
            effective_sites=8.0,
            loss=1.5,
            previous_loss=2.0,
            half_loss=2.5,
            half_sites=4.0,
            half_accuracy=0.68,
        )
    )
    assert policy.averaging_scale() == pytest.approx(4 / 3)


def test_split_half_accuracy_waits_for_a_half_accuracy():
    policy = PowerTripGreedy(GreedyConfig(gain=GainModel.SPLIT_HALF_ACCURACY, min_sites=2))
    policy.observe(
        RoundFeedback(
            1, np.arange(8), 10.0, 0.7, 0.6, effective_sites=8.0, half_loss=1.6, half_sites=4.0
        )
    )
    assert policy.averaging_scale() == 0.0
