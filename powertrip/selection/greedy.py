"""Algorithm 1: PowerTrip's greedy, bottom-up choice of how many ranked sites train each round.

After every round the policy projects the accuracy gain of each candidate count k' (a gain model)
and the round time of the top-k' sites (an estimator), and moves towards the count with the best
gain per second: growing at once, shrinking only after ``patience`` consecutive votes.

Options kept side by side (spec §3.2-§3.5, docs/reproduction.md):
- gain ``log`` (the paper's, reconstructed), ``kappa-headroom`` (spec §3.5), and two of the
  project's own that measure how much averaging more sites helps: ``noise-scale`` (dispersion of
  the site updates, tr(Sigma)/|G|^2), ``noise-directional`` (the same along the direction the model
  moves: the variance of the updates' projections on the last global delta over their squared
  mean; the default since docs/reproduction.md §5.1) and ``split-half`` (validation loss of the
  model averaged from half of the sites against the full average; ``split-half-accuracy`` fits
  the same on the validation error 1 - accuracy, the quantity time-to-accuracy measures);
- estimator ``mean-power`` (as written), ``max`` and ``aggregate`` (scoring.Estimator);
- search ``window-argmax`` (§3.2) or ``incremental-prefix`` (§3.4).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from powertrip.selection.base import (
    RankingConfig,
    RoundContext,
    RoundFeedback,
    SelectionPolicy,
)
from powertrip.selection.scoring import Estimator, prefix_round_times


class GainModel(StrEnum):
    LOG = "log"
    KAPPA_HEADROOM = "kappa-headroom"
    NOISE_SCALE = "noise-scale"
    NOISE_DIRECTIONAL = "noise-directional"
    SPLIT_HALF = "split-half"
    SPLIT_HALF_ACCURACY = "split-half-accuracy"


class SearchMode(StrEnum):
    WINDOW_ARGMAX = "window-argmax"
    INCREMENTAL_PREFIX = "incremental-prefix"


@dataclass(frozen=True)
class GreedyConfig:
    """Every free parameter of spec §3.3, with the spec's defaults."""

    k0: int = 10
    window: int = 5  # candidate counts k-w..k+w; 0 searches every count 1..N
    patience: int = 3
    trend_rounds: int = 3
    gain_floor: float = 1e-4
    gain: GainModel = GainModel.LOG
    kappa: float = 1.0
    estimator: Estimator = Estimator.MEAN_POWER
    search: SearchMode = SearchMode.WINDOW_ARGMAX
    noise_smoothing: float = 0.7  # EMA weight on history for the measured gain statistics
    min_sites: int = 1  # split-half needs two sites to measure anything
    ranking: RankingConfig = field(default_factory=RankingConfig)

    def __post_init__(self) -> None:
        checks = {
            "k0": self.k0 >= 1,
            "window": self.window >= 0,
            "patience": self.patience >= 1,
            "trend_rounds": self.trend_rounds >= 1,
            "gain_floor": self.gain_floor > 0,
            "kappa": self.kappa >= 0,
            "noise_smoothing": 0 <= self.noise_smoothing < 1,
            "min_sites": self.min_sites >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid greedy policy parameter(s): {', '.join(bad)}")


class PowerTripGreedy(SelectionPolicy):
    """Algorithm 1 (spec §3.2) over a pluggable ranking, gain model and time estimator."""

    def __init__(self, config: GreedyConfig | None = None, name: str = "powertrip"):
        self.config = config or GreedyConfig()
        self.name = name
        self.wants_split_half = self.config.gain in (
            GainModel.SPLIT_HALF,
            GainModel.SPLIT_HALF_ACCURACY,
        )
        self.wants_direction = self.config.gain is GainModel.NOISE_DIRECTIONAL
        self.k: int | None = None
        self.k_history: list[int] = []
        self._shrink_votes = 0
        self._accuracy: deque[float] = deque(maxlen=self.config.trend_rounds + 1)
        self._best_gain = 0.0
        self._feedback: RoundFeedback | None = None
        self._noise_trace: float | None = None  # EMA of tr(Sigma), per-site update variance
        self._signal: float | None = None  # EMA of |G|^2, the squared norm of the true update
        self._noise_par: float | None = None  # EMA of u'Sigma u along the last global delta u
        self._signal_par: float | None = None  # EMA of (G.u)^2
        self._penalty: float | None = None  # EMA of c: loss added by averaging only 1 site
        self._progress: float | None = None  # EMA of the noise-free loss decrease per round

    # -- the policy interface -------------------------------------------------------------------
    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        order = self.config.ranking.order(ctx)
        n = order.size
        if self.k is None:
            self.k = min(max(self.config.k0, self.config.min_sites), n)
        elif self._feedback is not None:
            self.k = self._next_k(min(self.k, n), self.prefix_times(ctx, order), self._feedback)
        self.k = min(self.k, n)
        self._feedback = None
        self.k_history.append(self.k)
        return order[: self.k]

    def prefix_times(self, ctx: RoundContext, order: NDArray[np.int64]) -> NDArray[np.float64]:
        """T_hat(k) for the first k sites of ``order``; a subclass may model rounds otherwise."""
        return prefix_round_times(ctx.profile, order, ctx.ideal_compute_s, self.config.estimator)

    def observe(self, feedback: RoundFeedback) -> None:
        if not self._accuracy:
            self._accuracy.append(feedback.previous_accuracy)
        self._accuracy.append(feedback.accuracy)
        gain = feedback.accuracy - feedback.previous_accuracy
        self._best_gain = max(self._best_gain, gain)
        self._update_noise(feedback)
        self._update_split_half(feedback)
        self._feedback = feedback

    # -- Algorithm 1 lines 9-21 -----------------------------------------------------------------
    def _trend(self) -> float:
        """Line 9: mean per-round accuracy gain over the last m rounds, floored at epsilon."""
        hist = list(self._accuracy)
        rounds = len(hist) - 1
        if rounds < 1:
            return self.config.gain_floor
        return max(self.config.gain_floor, (hist[-1] - hist[0]) / rounds)

    def projected_gain(self, candidates: NDArray[np.int64], k: int) -> NDArray[np.float64]:
        """Line 13: Delta A_hat(k') for each candidate count, relative to the current count k."""
        trend = self._trend()
        kc = candidates.astype(np.float64)
        gain = GainModel(self.config.gain)
        if gain is GainModel.LOG:
            return trend * np.log1p(kc) / math.log1p(k)
        if gain is GainModel.KAPPA_HEADROOM:
            headroom = 1.0 - trend / self._best_gain if self._best_gain > 0 else 0.0
            headroom = min(max(headroom, 0.0), 1.0)
            return trend * (1.0 + self.config.kappa * headroom * np.log((1 + kc) / (1 + k)))
        if gain in (GainModel.NOISE_SCALE, GainModel.NOISE_DIRECTIONAL):
            b = self.noise_scale(directional=gain is GainModel.NOISE_DIRECTIONAL)
            return trend * (kc / (kc + b)) / (k / (k + b))
        b = self.averaging_scale()
        return trend * self._averaged_progress(kc, b) / self._averaged_progress(np.array(k), b)

    @staticmethod
    def _averaged_progress(sites: NDArray[np.float64], scale: float) -> NDArray[np.float64]:
        """Loss decrease of a round averaging m sites, relative to infinitely many: 1 - b/m."""
        return np.maximum(1.0 - scale / np.asarray(sites, dtype=np.float64), 1e-2)

    def averaging_scale(self) -> float:
        """b = c / (noise-free progress): averaging m sites keeps a fraction 1 - b/m of it."""
        if self._penalty is None or self._progress is None:
            return 0.0
        if self._progress <= 0:
            return math.inf if self._penalty > 0 else 0.0
        return self._penalty / self._progress

    def _update_split_half(self, fb: RoundFeedback) -> None:
        """Fit L(m) = L_inf + c/m through the full and half averages of this round's updates.

        L is the validation loss, or the validation error 1 - accuracy for split-half-accuracy.
        """
        if self.config.gain is GainModel.SPLIT_HALF_ACCURACY:
            if fb.half_accuracy is None:
                return
            full, previous, half = (
                1.0 - fb.accuracy,
                1.0 - fb.previous_accuracy,
                1.0 - fb.half_accuracy,
            )
        else:
            if fb.loss is None or fb.previous_loss is None or fb.half_loss is None:
                return
            full, previous, half = fb.loss, fb.previous_loss, fb.half_loss
        if fb.half_sites is None or fb.effective_sites is None:
            return
        m_full, m_half = float(fb.effective_sites), float(fb.half_sites)
        if m_half >= m_full - 1e-9:
            return
        penalty = max((half - full) / (1.0 / m_half - 1.0 / m_full), 0.0)
        progress = previous - (full - penalty / m_full)
        a = self.config.noise_smoothing
        if self._penalty is None:
            self._penalty, self._progress = penalty, progress
        else:
            self._penalty = a * self._penalty + (1 - a) * penalty
            self._progress = a * (self._progress or 0.0) + (1 - a) * progress

    def noise_scale(self, directional: bool = False) -> float:
        """B = tr(Sigma) / |G|^2 in units of sites: averaging k updates gives progress k/(k+B).

        ``directional``: B_par = u'Sigma u / (G.u)^2 along the last global delta u, the noise
        the loss feels when the curvature is concentrated along the direction of travel (B_crit
        = tr(H Sigma) / G'HG with H ~ lambda u u'). Falls back to B before the first projection.
        """
        noise, signal = self._noise_trace, self._signal
        if directional and self._noise_par is not None:
            noise, signal = self._noise_par, self._signal_par
        if noise is None or signal is None:
            return 0.0
        return noise / max(signal, 1e-12 * max(noise, 1e-30))

    @staticmethod
    def noise_estimate(mean_sq: float, sq_of_mean: float, k_eff: float) -> tuple[float, float]:
        """Unbiased (noise, signal) from one round's k_eff weighted updates.

        E[mean |d_i|^2] = |G|^2 + tr(S);  E[|mean d|^2] = |G|^2 + tr(S)/k_eff. The same holds
        for the scalar projections p_i = d_i.u with u'Su and (G.u)^2.
        """
        noise = max(mean_sq - sq_of_mean, 0.0) / (1.0 - 1.0 / k_eff)
        return noise, max(sq_of_mean - noise / k_eff, 0.0)

    def _update_noise(self, fb: RoundFeedback) -> None:
        if fb.mean_sq_norm is None or fb.sq_norm_of_mean is None or not fb.effective_sites:
            return
        k_eff = fb.effective_sites
        if k_eff <= 1.0 + 1e-9:
            return
        a = self.config.noise_smoothing
        trace, signal = self.noise_estimate(fb.mean_sq_norm, fb.sq_norm_of_mean, k_eff)
        if self._noise_trace is None:
            self._noise_trace, self._signal = trace, signal
        else:
            self._noise_trace = a * self._noise_trace + (1 - a) * trace
            self._signal = a * (self._signal or 0.0) + (1 - a) * signal
        if fb.mean_proj is None or fb.mean_sq_proj is None:
            return
        noise, signal = self.noise_estimate(fb.mean_sq_proj, fb.mean_proj**2, k_eff)
        if self._noise_par is None:
            self._noise_par, self._signal_par = noise, signal
        else:
            self._noise_par = a * self._noise_par + (1 - a) * noise
            self._signal_par = a * (self._signal_par or 0.0) + (1 - a) * signal

    def _next_k(self, k: int, prefix_times: NDArray[np.float64], fb: RoundFeedback) -> int:
        n = prefix_times.size
        w = self.config.window or n
        lo, hi = max(min(self.config.min_sites, n), k - w), min(n, k + w)
        candidates = np.arange(lo, hi + 1, dtype=np.int64)
        efficiency = self.projected_gain(candidates, k) / prefix_times[candidates - 1]
        if SearchMode(self.config.search) is SearchMode.WINDOW_ARGMAX:
            best = int(candidates[int(np.argmax(efficiency))])  # argmax takes the first: smaller k
        else:
            measured = (fb.accuracy - fb.previous_accuracy) / max(fb.duration_s, 1e-12)
            i = 0
            while i + 1 < candidates.size and efficiency[i + 1] > max(efficiency[i], measured):
                i += 1
            best = int(candidates[i])
        return self._apply_patience(k, best)

    def _apply_patience(self, k: int, best: int) -> int:
        """Lines 17-21: grow immediately, shrink after p consecutive votes to shrink."""
        if best > k:
            self._shrink_votes = 0
            return best
        if best < k:
            self._shrink_votes += 1
            if self._shrink_votes >= self.config.patience:
                self._shrink_votes = 0
                return best
            return k
        self._shrink_votes = 0
        return k
