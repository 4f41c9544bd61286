"""Algorithm 1: the greedy, bottom-up site-count policy of the PowerTrip paper.

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

import numpy as np
import pytest

from powertrip.selection.base import RankingConfig, RoundContext, RoundFeedback
from powertrip.selection.gains import (
    DirectionalNoiseGain,
    KappaHeadroomGain,
    LogGain,
    NoiseScaleGain,
    SplitHalfAccuracyGain,
    SplitHalfGain,
)
from powertrip.selection.greedy import GainModel, GreedyConfig, PowerTripGreedy, SearchMode
from powertrip.selection.scoring import Estimator, Ranking
from powertrip.sites.profiles import SiteProfile

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
    # E(k') = trend * g(k') / g(k) / T_hat(k'): the positive factor trend cancels in the argmax.
    # Worked path (k0 = 1, window 2, patience 2):
    #   PEAK4: 1 -> 3 (cands 1..3) -> 4 (cands 1..5) -> 4 (hold)
    #   STEEP: vote, shrink to 2 (cands 2..6) -> vote, shrink to 1 (cands 1..4)
    #   FLAT:  3 -> 5 -> 7
    comms = [PEAK4] * 4 + [STEEP] * 4 + [FLAT] * 3
    history = run(greedy(k0=1, window=2, patience=2), comms, accuracies)
    assert history == [1, 3, 4, 4, 4, 2, 2, 1, 3, 5, 7]


# --------------------------------------------------------------- the gain model in the policy
# Each model's own statistics and projections are specified in test_gains.py; here, that the
# policy builds the configured one, feeds it every round and projects with its own trend.


@pytest.mark.parametrize(
    ("model", "cls", "split_half", "direction"),
    [
        (GainModel.LOG, LogGain, False, False),
        (GainModel.KAPPA_HEADROOM, KappaHeadroomGain, False, False),
        (GainModel.NOISE_SCALE, NoiseScaleGain, False, False),
        (GainModel.NOISE_DIRECTIONAL, DirectionalNoiseGain, False, True),
        (GainModel.SPLIT_HALF, SplitHalfGain, True, False),
        (GainModel.SPLIT_HALF_ACCURACY, SplitHalfAccuracyGain, True, False),
    ],
)
def test_the_policy_holds_the_configured_gain_model_and_declares_its_probes(
    model, cls, split_half, direction
):
    policy = greedy(gain=model)
    assert type(policy.gain) is cls
    assert (policy.wants_split_half, policy.wants_direction) == (split_half, direction)


def test_kappa_headroom_projects_from_the_policys_trend_and_best_round():
    # gains 0.3 then 0.1: trend (0.4 - 0) / 2 = 0.2, best gain 0.3, headroom 1/3;
    # kappa = 2: 0.2 * (1 + 2 * (1/3) * ln((1+7) / (1+3))) = 0.292419624 at k' = 7
    policy = greedy(gain=GainModel.KAPPA_HEADROOM, kappa=2.0)
    policy.observe(feedback(0.0, 0.3))
    policy.observe(feedback(0.3, 0.4))
    assert policy.projected_gain(np.array([3, 7]), 3) == pytest.approx([0.2, 0.292419624])


def dispersion_feedback(signal: float, trace: float, k_eff: float) -> RoundFeedback:
    """A 0.2 -> 0.3 round whose update dispersion gives |G|^2 = signal, tr(Sigma) = trace."""
    return feedback(
        0.2,
        0.3,
        mean_sq_norm=signal + trace,
        sq_norm_of_mean=signal + trace / k_eff,
        effective_sites=k_eff,
    )


def test_noise_scale_projects_the_averaging_benefit_with_the_policys_trend():
    # one round: trend 0.1, B = 6 / 2 = 3, k = 4: 0.1 * (k'/(k'+3)) / (4/7)
    policy = greedy(gain=GainModel.NOISE_SCALE)
    policy.observe(dispersion_feedback(2.0, 6.0, 4.0))
    assert policy.projected_gain(np.array([1, 4, 12]), 4) == pytest.approx([0.04375, 0.1, 0.14])


def test_the_configured_smoothing_reaches_the_gain_model():
    # EMA weight 0.5: tr = 0.5 * 6 + 0.5 * 12 = 9, |G|^2 = 0.5 * 2 + 0.5 * 1 = 1.5 -> B = 6
    policy = greedy(gain=GainModel.NOISE_SCALE, noise_smoothing=0.5)
    policy.observe(dispersion_feedback(2.0, 6.0, 4.0))
    policy.observe(dispersion_feedback(1.0, 12.0, 4.0))
    assert policy.gain.noise_scale() == pytest.approx(6.0)


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
    assert policy.gain.averaging_scale() == pytest.approx(4 / 3)
    gain = policy.projected_gain(np.array([8, 16]), k=8)
    assert gain[1] / gain[0] == pytest.approx(1.1)


def test_split_half_policy_never_drops_below_two_sites():
    # k0 = 1 is lifted to the floor: one site gives no half to compare against
    profile = SiteProfile(power=np.full(5, 0.5), comm_s=np.ones(5), distance_mi=np.ones(5))
    ctx = RoundContext(1, 0.0, profile, 10.0, 1.5e9, np.random.default_rng(0))
    policy = PowerTripGreedy(GreedyConfig(gain=GainModel.SPLIT_HALF, min_sites=2, k0=1))
    assert len(policy.select(ctx)) == 2


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
