"""The gain models of Algorithm 1 line 13, each on its own: what a model learns from a round's
feedback, and the gain it projects for candidate site counts k' relative to the current count k
(where the gain is the accuracy trend, passed in as the policy measured it)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from powertrip.aggregation.fedavg import StreamingFedAvg
from powertrip.selection.base import RoundFeedback
from powertrip.selection.gains import (
    DirectionalNoiseGain,
    GainModel,
    KappaHeadroomGain,
    LogGain,
    NoiseScaleGain,
    SplitHalfAccuracyGain,
    SplitHalfGain,
    build_gain,
)


def feedback(prev: float = 0.2, acc: float = 0.3, **stats) -> RoundFeedback:
    return RoundFeedback(1, np.arange(8), 10.0, acc, prev, **stats)


def project(gain, trend: float, candidates: list[int], k: int) -> list[float]:
    return gain.project(trend, np.array(candidates, dtype=np.int64), k).tolist()


# ------------------------------------------------------------------------- names and probes


#: each configured name -> (its model, needs the split-half probe, needs the projections)
MODELS = {
    "log": (LogGain, False, False),
    "kappa-headroom": (KappaHeadroomGain, False, False),
    "noise-scale": (NoiseScaleGain, False, False),
    "noise-directional": (DirectionalNoiseGain, False, True),
    "split-half": (SplitHalfGain, True, False),
    "split-half-accuracy": (SplitHalfAccuracyGain, True, False),
}


@pytest.mark.parametrize(("name", "expected"), MODELS.items(), ids=list(MODELS))
def test_each_name_builds_its_own_model_which_declares_the_probes_it_needs(name, expected):
    assert set(MODELS) == {str(model) for model in GainModel}  # every name is covered
    gain = build_gain(name, kappa=1.0, smoothing=0.7)
    assert (type(gain), gain.wants_split_half, gain.wants_direction) == expected


def test_each_build_is_a_fresh_model_with_its_own_statistics():
    a = build_gain(GainModel.KAPPA_HEADROOM, kappa=1.0, smoothing=0.7)
    b = build_gain(GainModel.KAPPA_HEADROOM, kappa=1.0, smoothing=0.7)
    a.observe(feedback(0.0, 0.3))
    assert (a.best_gain, b.best_gain) == (0.3, 0.0)


# --------------------------------------------------------------------------------------- log


def test_log_gain_rescales_the_trend_per_log_worker_whatever_the_feedback():
    # 0.1 * log(1+k') / log(1+3) = 0.1 * [log 2, log 4, log 8] / log 4 = 0.1 * [0.5, 1, 1.5]
    gain = LogGain()
    assert project(gain, 0.1, [1, 3, 7], 3) == pytest.approx([0.05, 0.1, 0.15])
    gain.observe(feedback(0.0, 0.9, mean_sq_norm=8.0, sq_norm_of_mean=3.5, effective_sites=4.0))
    assert project(gain, 0.1, [1, 3, 7], 3) == pytest.approx([0.05, 0.1, 0.15])


# ---------------------------------------------------------------------------- kappa-headroom


def test_kappa_headroom_gain_grows_as_per_round_gains_flatten():
    # best single-round gain 0.3; a trend of 0.2 leaves headroom 1 - 0.2 / 0.3 = 1/3:
    # 0.2 * (1 + (1/3) * ln((1+k') / 4)) = 0.2 * [1 - ln2/3, 1, 1 + ln2/3]
    gain = KappaHeadroomGain(kappa=1.0)
    gain.observe(feedback(0.0, 0.3))
    gain.observe(feedback(0.3, 0.4))
    assert gain.headroom(0.2) == pytest.approx(1 / 3)
    assert project(gain, 0.2, [1, 3, 7], 3) == pytest.approx([0.1537901880, 0.2, 0.2462098120])


def test_kappa_scales_the_headroom_term_and_zero_turns_it_off():
    # headroom 1/3 as above: 0.2 * (1 + kappa * (1/3) * ln 2) at k' = 7
    for kappa, expected in [(0.0, 0.2), (2.0, 0.292419624)]:
        gain = KappaHeadroomGain(kappa)
        gain.observe(feedback(0.0, 0.3))
        assert project(gain, 0.2, [7], 3) == pytest.approx([expected])


@pytest.mark.parametrize(
    ("best", "trend", "headroom"),
    [
        (None, 0.2, 0.0),  # no round seen: no best gain to measure headroom against
        (-0.1, 0.2, 0.0),  # only losing rounds: the best gain stays 0
        (0.1, 0.1, 0.0),  # gains at their best: extra sites project no extra gain
        (0.1, 0.2, 0.0),  # trend above the best round: clipped at 0
        (0.4, 1e-4, 0.99975),  # a floored trend far below the best: nearly 1
    ],
)
def test_kappa_headroom_stays_in_the_unit_interval(best, trend, headroom):
    gain = KappaHeadroomGain(kappa=1.0)
    if best is not None:
        gain.observe(feedback(0.5, 0.5 + best))
    assert gain.headroom(trend) == pytest.approx(headroom)


# ------------------------------------------------------------------------------ noise scale


def dispersion(signal: float, trace: float, k_eff: float, **more) -> RoundFeedback:
    """Feedback whose statistics are the expectations for |G|^2 = signal, tr(Sigma) = trace:
    weighted mean |d_i|^2 = |G|^2 + tr(Sigma), |mean d|^2 = |G|^2 + tr(Sigma) / k_eff."""
    return feedback(
        mean_sq_norm=signal + trace,
        sq_norm_of_mean=signal + trace / k_eff,
        effective_sites=k_eff,
        **more,
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
    gain = NoiseScaleGain(smoothing=0.7)
    gain.observe(dispersion(signal, trace, k_eff))
    assert gain.noise_scale() == pytest.approx(noise_scale)


def fedavg_round(rng, g, direction=None) -> RoundFeedback:
    """100 sites with d_i = g + N(0, 0.12 I) and unequal sample weights, averaged by FedAvg."""
    agg = StreamingFedAvg({"w": np.zeros(g.size)}, direction=direction)
    for weight in rng.uniform(1.0, 3.0, size=100):
        agg.add({"w": g + math.sqrt(0.12) * rng.standard_normal(g.size)}, float(weight))
    mean_sq, sq_mean, k_eff = agg.dispersion()
    stats = {"mean_sq_norm": mean_sq, "sq_norm_of_mean": sq_mean, "effective_sites": k_eff}
    if direction is not None:
        stats["mean_proj"], stats["mean_sq_proj"] = agg.projection()
    return feedback(**stats)


def test_noise_scale_recovers_b_from_real_fedavg_dispersion():
    # 50 dims, G = 0.2 each: |G|^2 = 2, tr(Sigma) = 50 * 0.12 = 6, so B = 3
    rng, g = np.random.default_rng(0), np.full(50, 0.2)
    gain = NoiseScaleGain(smoothing=0.9)
    for _ in range(60):
        gain.observe(fedavg_round(rng, g))
    assert gain.noise_scale() == pytest.approx(3.0, rel=0.1)


def test_noise_scale_statistics_are_smoothed_separately():
    # EMA weight 0.7 on history: tr = 0.7 * 6 + 0.3 * 12 = 7.8, |G|^2 = 0.7 * 2 + 0.3 * 1 = 1.7
    gain = NoiseScaleGain(smoothing=0.7)
    gain.observe(dispersion(2.0, 6.0, 4.0))
    gain.observe(dispersion(1.0, 12.0, 4.0))
    assert gain.noise_scale() == pytest.approx(7.8 / 1.7)


@pytest.mark.parametrize(
    "stats",
    [
        {},  # no dispersion reported
        {"mean_sq_norm": 8.0, "sq_norm_of_mean": 3.5, "effective_sites": 1.0},  # one site
        {"mean_sq_norm": 8.0, "sq_norm_of_mean": 3.5, "effective_sites": None},
    ],
    ids=["missing", "single-site", "no-k-eff"],
)
def test_noise_scale_ignores_rounds_that_cannot_measure_dispersion(stats):
    gain = NoiseScaleGain(smoothing=0.7)
    gain.observe(feedback(**stats))
    assert gain.noise_scale() == 0.0
    # with B = 0 the gain k'/(k'+B) is flat: the trend for every candidate
    assert project(gain, 0.1, [1, 4, 12], 4) == pytest.approx([0.1, 0.1, 0.1])


def test_noise_scale_gain_is_the_averaging_benefit_k_over_k_plus_b():
    # B = 3, k = 4: 0.1 * (k'/(k'+3)) / (4/7) = 0.1 * [0.25, 4/7, 0.8] * 7/4
    gain = NoiseScaleGain(smoothing=0.7)
    gain.observe(dispersion(2.0, 6.0, 4.0))
    assert project(gain, 0.1, [1, 4, 12], 4) == pytest.approx([0.04375, 0.1, 0.14])


# ----------------------------------------------------------------- directional noise scale


def directional(
    signal: float, trace: float, signal_par: float, noise_par: float, k_eff: float
) -> RoundFeedback:
    """Expected statistics for |G|^2, tr(Sigma) and, along u, (G.u)^2 and u'Sigma u."""
    return dispersion(
        signal,
        trace,
        k_eff,
        mean_proj=math.sqrt(signal_par + noise_par / k_eff),
        mean_sq_proj=signal_par + noise_par,
    )


def test_directional_noise_scale_uses_the_projections_only():
    # B = 12 / 2 = 6 overall; along u: (G.u)^2 = 1.5, u'Sigma u = 0.75 -> B_par = 0.5
    #   mean p^2 = 2.25, (mean p)^2 = 1.5 + 0.75 / 4 = 1.6875
    #   noise = (2.25 - 1.6875) / 0.75 = 0.75, signal = 1.6875 - 0.75 / 4 = 1.5
    gain = DirectionalNoiseGain(smoothing=0.7)
    gain.observe(directional(2.0, 12.0, 1.5, 0.75, 4.0))
    assert gain.noise_scale() == pytest.approx(0.5)
    assert gain.isotropic.value == pytest.approx((12.0, 2.0))  # still measured, not used
    # k'/(k'+0.5) relative to k = 4 (4 / 4.5), trend 0.1:
    #   k'=1: 0.1 * (1 / 1.5) * (4.5 / 4) = 0.075;  k'=2: 0.1 * 0.8 * 1.125 = 0.09
    assert project(gain, 0.1, [1, 2, 4], 4) == pytest.approx([0.075, 0.09, 0.1])


def test_directional_noise_scale_falls_back_to_b_before_the_first_projection():
    gain = DirectionalNoiseGain(smoothing=0.7)
    gain.observe(dispersion(2.0, 6.0, 4.0))  # round 1: no previous delta yet
    assert gain.along_direction.value is None
    assert gain.noise_scale() == pytest.approx(3.0)


def test_directional_statistics_are_smoothed_separately():
    # EMA 0.7: u'Su = 0.7 * 0.75 + 0.3 * 3 = 1.425, (G.u)^2 = 0.7 * 1.5 + 0.3 * 1 = 1.35
    gain = DirectionalNoiseGain(smoothing=0.7)
    gain.observe(directional(2.0, 12.0, 1.5, 0.75, 4.0))
    gain.observe(directional(2.0, 12.0, 1.0, 3.0, 4.0))
    assert gain.noise_scale() == pytest.approx(1.425 / 1.35)


def test_directional_noise_scale_from_real_fedavg_projections():
    # projected on u = G / |G|: (G.u)^2 = 2 and u'Sigma u = 0.12 -> B_par = 0.06, while the
    # isotropic B is 3: isotropic noise mostly lies off the direction of travel
    rng, g = np.random.default_rng(0), np.full(50, 0.2)
    gain = DirectionalNoiseGain(smoothing=0.9)
    for _ in range(60):
        gain.observe(fedavg_round(rng, g, direction={"w": g}))
    noise, signal = gain.isotropic.value
    assert noise / signal == pytest.approx(3.0, rel=0.1)
    assert gain.noise_scale() == pytest.approx(0.06, rel=0.2)


# -------------------------------------------------------------------------------- split-half


def test_split_half_gain_fits_loss_against_sites_averaged():
    # m = 8 sites give L = 1.5, their every-other half (m = 4) gives 1.6, the round began at 2.0:
    # c = 0.1 / (1/4 - 1/8) = 0.8, L_inf = 1.5 - 0.8/8 = 1.4, noise-free progress 0.6,
    # b = 0.8 / 0.6 = 4/3; averaging 16 instead of 8 keeps (1 - b/16) / (1 - b/8) = 1.1x.
    gain = SplitHalfGain(smoothing=0.7)
    gain.observe(
        feedback(effective_sites=8.0, loss=1.5, previous_loss=2.0, half_loss=1.6, half_sites=4.0)
    )
    assert gain.fit.value == pytest.approx((0.8, 0.6))
    assert gain.averaging_scale() == pytest.approx(4 / 3)
    assert project(gain, 0.1, [8, 16], 8) == pytest.approx([0.1, 0.11])


@pytest.mark.parametrize(
    ("fit", "scale"),
    [
        ((0.8, 0.0), math.inf),  # averaging only fought the noise: no site count helps enough
        ((0.0, 0.0), 0.0),  # nothing moved at all
        ((0.0, 0.5), 0.0),  # a half averages as well as the full set
    ],
)
def test_split_half_averaging_scale_edge_cases(fit, scale):
    gain = SplitHalfGain(smoothing=0.7)
    gain.fit.value = fit
    assert gain.averaging_scale() == scale


def test_split_half_floors_the_averaged_progress_at_one_percent():
    # b = 4/3 makes 1 - b/1 negative for one site: floored at 0.01, against 1 - b/8 = 5/6 at k = 8
    gain = SplitHalfGain(smoothing=0.7)
    gain.fit.value = (0.8, 0.6)
    assert project(gain, 0.1, [1], 8) == pytest.approx([0.1 * 0.01 / (5 / 6)])


@pytest.mark.parametrize(
    "missing",
    [
        {"half_loss": None},
        {"half_sites": None},
        {"half_sites": 8.0},  # the "half" is no smaller than the full set
    ],
)
def test_split_half_ignores_rounds_without_a_usable_half(missing):
    stats = {"effective_sites": 8.0, "loss": 1.5, "previous_loss": 2.0, "half_loss": 1.6}
    gain = SplitHalfGain(smoothing=0.7)
    gain.observe(feedback(**{**stats, "half_sites": 4.0, **missing}))
    assert gain.fit.value is None and gain.averaging_scale() == 0.0


def test_split_half_accuracy_fits_the_validation_error_not_the_loss():
    # m = 8 sites reach accuracy 0.70 (error 0.30), their half (m = 4) 0.68 (error 0.32), the
    # round began at 0.60 (error 0.40): c = 0.02 / (1/4 - 1/8) = 0.16, E_inf = 0.30 - 0.16/8
    # = 0.28, noise-free progress 0.40 - 0.28 = 0.12, b = 0.16 / 0.12 = 4/3. The losses would
    # give b = 4/3 * 10 (half_loss 2.5): they must be ignored.
    losses = {"loss": 1.5, "previous_loss": 2.0, "half_loss": 2.5, "half_sites": 4.0}
    gain = SplitHalfAccuracyGain(smoothing=0.7)
    gain.observe(feedback(0.60, 0.70, effective_sites=8.0, **losses))  # no half accuracy: wait
    assert gain.averaging_scale() == 0.0
    gain.observe(feedback(0.60, 0.70, effective_sites=8.0, half_accuracy=0.68, **losses))
    assert gain.averaging_scale() == pytest.approx(4 / 3)
