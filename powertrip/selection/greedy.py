"""Algorithm 1: PowerTrip's greedy, bottom-up choice of how many ranked sites train each round.

After every round the policy projects the accuracy gain of each candidate count k' (a gain model,
``powertrip.selection.gains``) and the round time of the top-k' sites (an estimator), and moves
towards the count with the best gain per second: growing at once, shrinking only after
``patience`` consecutive votes.

Options kept side by side (docs/reproduction.md §2):
- gain: the paper's ``log`` and the project's alternatives, one class each (see ``gains``);
- estimator ``mean-power`` (as written in Algorithm 1), ``max`` and ``aggregate`` (Eq. 7);
- search ``window-argmax`` (Algorithm 1's argmax over k-w..k+w) or ``incremental-prefix`` (add
  sites one at a time while each beats the last and the measured gain per second).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import numpy as np
from numpy.typing import NDArray

from powertrip import state_dict as sd
from powertrip.config.sites import RoundTimeModel
from powertrip.selection.base import (
    RankingConfig,
    RoundContext,
    RoundFeedback,
    SelectionPolicy,
    SiteRanking,
    feedback_from,
    feedback_state,
)
from powertrip.selection.gains import GainModel, ProjectedGain, build_gain
from powertrip.selection.registration import PolicyContext, PolicyFactory, register_policy
from powertrip.selection.scoring import Estimator, Ranking, prefix_round_times
from powertrip.selection.topk import KeyedRanking, RankedPrefix

__all__ = ["GainModel", "GreedyConfig", "PowerTripGreedy", "SearchMode"]


class SearchMode(StrEnum):
    WINDOW_ARGMAX = "window-argmax"
    INCREMENTAL_PREFIX = "incremental-prefix"


@dataclass(frozen=True)
class GreedyConfig:
    """Every free parameter of Algorithm 1; the defaults are the paper's reconstruction
    (k0 = 10, w = 5, p = 3, m = 3, epsilon = 1e-4, log gain, mean-power estimate)."""

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
    ranking: SiteRanking = field(default_factory=RankingConfig)
    #: the site count k0 and window are meant for; with more sites both grow in proportion
    #: (``scaled``), so the ramp-up takes as many rounds at 1,000 sites as at 100; 0: absolute
    reference_sites: int = 0
    #: > 0: when the projected gain per round of the chosen count cannot reach the run's target
    #: in the rounds left (both from the round context) for this many decisions in a row, grow
    #: to the smallest candidate count whose gain can (the largest if none); 0: off. Applies to
    #: the window-argmax search (the default); incremental-prefix ignores it
    round_budget: int = 0

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
            "reference_sites": self.reference_sites >= 0,
            "round_budget": self.round_budget >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid greedy policy parameter(s): {', '.join(bad)}")

    def scaled(self, n: int) -> tuple[int, int]:
        """(k0, window) for n sites: as given up to ``reference_sites``, in proportion above."""
        if not self.reference_sites or n <= self.reference_sites:
            return self.k0, self.window
        share = n / self.reference_sites
        return math.ceil(self.k0 * share), math.ceil(self.window * share)

    def make_gain(self) -> ProjectedGain:
        """A fresh model of the configured gain, with this config's kappa and smoothing."""
        return build_gain(self.gain, kappa=self.kappa, smoothing=self.noise_smoothing)


class PowerTripGreedy(SelectionPolicy):
    """Algorithm 1 over a pluggable ranking, gain model and time estimator.

    The policy keeps the accuracy trend and the count k; the gain model (``self.gain``) keeps
    whatever it measures, and declares which probes the executor must run for it.
    """

    def __init__(self, config: GreedyConfig | None = None, name: str = "powertrip") -> None:
        self.config = config or GreedyConfig()
        self.name = name
        self.gain: ProjectedGain = self.config.make_gain()
        self.wants_split_half = self.gain.wants_split_half
        self.wants_direction = self.gain.wants_direction
        self.k: int | None = None
        self.k_history: list[int] = []
        self._shrink_votes = 0
        self._accuracy: deque[float] = deque(maxlen=self.config.trend_rounds + 1)
        self._feedback: RoundFeedback | None = None
        self._ranked = RankedPrefix()  # the ranking's best sites, while the profile is unchanged
        self._budget: tuple[float | None, int | None] = (None, None)  # (target, rounds left)
        self._behind = 0  # decisions in a row whose projected gain missed the budget's need

    # -- the policy interface -------------------------------------------------------------------
    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        # Only the first k + w ranked sites can be chosen (window 0: all), so only those are
        # ranked: the full order's prefix, identical to slicing a full ranking.
        n = ctx.profile.size
        self._budget = (ctx.target_accuracy, ctx.rounds_left)
        k0, window = self.config.scaled(n)
        if self.k is None:
            self.k = min(max(k0, self.config.min_sites), n)
        elif self._feedback is not None:
            k = min(self.k, n)
            top = self._top(ctx, min(n, k + window) if window else n)
            self.k = self._next_k(k, self.prefix_times(ctx, top), self._feedback, n)
        self.k = min(self.k, n)
        self._feedback = None
        self.k_history.append(self.k)
        return self._top(ctx, self.k)

    def _top(self, ctx: RoundContext, m: int) -> NDArray[np.int64]:
        """The first m sites of the ranking: memoised when the ranking exposes its sort key, else
        sliced from its full order (a ranking that only implements ``order``)."""
        ranking = self.config.ranking
        if isinstance(ranking, KeyedRanking):
            return self._ranked.top(ranking, ctx, m)
        return ranking.order(ctx)[:m]

    def prefix_times(self, ctx: RoundContext, order: NDArray[np.int64]) -> NDArray[np.float64]:
        """T_hat(k) for the first k sites of ``order``; a subclass may model rounds otherwise."""
        return prefix_round_times(ctx.profile, order, ctx.ideal_compute_s, self.config.estimator)

    def state_dict(self) -> dict[str, Any]:
        """The count k, the shrink votes, the accuracy trend, the last round's feedback (read
        by the next decision), the decisions behind the budget and the gain model's state. The
        ranking memo (``RankedPrefix``) is rebuilt on demand: it never changes a selection."""
        return {
            "k": self.k,
            "shrink_votes": self._shrink_votes,
            "accuracy": [float(a) for a in self._accuracy],
            "feedback": feedback_state(self._feedback),
            "behind": self._behind,
            "gain": self.gain.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        where = f"policy {self.name} state"
        keys = {"k", "shrink_votes", "accuracy", "feedback", "behind", "gain"}
        d = sd.fields(state, where, keys)
        k = sd.integer(d["k"], f"{where}.k", optional=True)
        votes = sd.integer(d["shrink_votes"], f"{where}.shrink_votes")
        behind = sd.integer(d["behind"], f"{where}.behind")
        assert votes is not None and behind is not None  # not optional: None is refused
        accuracy = sd.numbers(d["accuracy"], f"{where}.accuracy")
        if len(accuracy) > self.config.trend_rounds + 1:
            raise ValueError(f"{where}.accuracy holds more rounds than the trend's")
        if (k is not None and k < 1) or votes < 0 or behind < 0:
            raise ValueError(f"{where}: a negative count")
        feedback = feedback_from(d["feedback"], f"{where}.feedback")
        self.gain.load_state_dict(d["gain"])  # checked first: nothing is set when it fails
        self.k, self._shrink_votes, self._behind, self._feedback = k, votes, behind, feedback
        self._accuracy = deque(accuracy, maxlen=self.config.trend_rounds + 1)

    def observe(self, feedback: RoundFeedback) -> None:
        if not self._accuracy:
            self._accuracy.append(feedback.previous_accuracy)
        self._accuracy.append(feedback.accuracy)
        self.gain.observe(feedback)
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
        return self.gain.project(self._trend(), candidates, k)

    def _next_k(
        self, k: int, prefix_times: NDArray[np.float64], fb: RoundFeedback, n: int | None = None
    ) -> int:
        """Lines 10-16 over the n sites, of which ``prefix_times`` covers at least the window."""
        n = prefix_times.size if n is None else n
        w = self.config.scaled(n)[1] or n
        lo, hi = max(min(self.config.min_sites, n), k - w), min(n, k + w)
        candidates = np.arange(lo, hi + 1, dtype=np.int64)
        gains = self.projected_gain(candidates, k)
        efficiency = gains / prefix_times[candidates - 1]
        if SearchMode(self.config.search) is SearchMode.WINDOW_ARGMAX:
            best = int(candidates[int(np.argmax(efficiency))])  # argmax takes the first: smaller k
            best = self._within_budget(candidates, gains, best)
        else:
            measured = (fb.accuracy - fb.previous_accuracy) / max(fb.duration_s, 1e-12)
            i = 0
            while i + 1 < candidates.size and efficiency[i + 1] > max(efficiency[i], measured):
                i += 1
            best = int(candidates[i])
        return self._apply_patience(k, best)

    def _within_budget(
        self, candidates: NDArray[np.int64], gains: NDArray[np.float64], best: int
    ) -> int:
        """``best``, or (``round_budget``) the smallest larger count whose projected gain per
        round reaches the target in the rounds left, once ``best``'s has fallen short for
        ``round_budget`` decisions in a row (the projected gain is noisy round to round)."""
        target, left = self._budget
        if not self.config.round_budget or target is None or not left or not self._accuracy:
            return best
        need = (target - self._accuracy[-1]) / left
        if need <= 0 or gains[int(np.searchsorted(candidates, best))] >= need:
            self._behind = 0
            return best
        self._behind += 1
        if self._behind < self.config.round_budget:
            return best
        more = np.flatnonzero((gains >= need) & (candidates > best))
        return int(candidates[more[0]] if more.size else candidates[-1])

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


# -- the variants a run builds by name (docs/reproduction.md §2) -------------------------------

#: The paper's Algorithm 1 as reconstructed here (Eq. 8 ranking, log gain, mean-power estimate).
PAPER_GREEDY = GreedyConfig()

#: The project's previous default (``powertrip-noise``): rank by each site's own round time,
#: project gains with the measured update noise scale B = tr(Sigma)/|G|^2, estimate the round by
#: its true straggler.
NOISE_GREEDY = GreedyConfig(
    gain=GainModel.NOISE_SCALE,
    estimator=Estimator.MAX,
    ranking=RankingConfig(ranking=Ranking.ROUND_TIME),
)

#: The project's default (docs/reproduction.md §5): the same, with the noise scale measured along
#: the direction the model moves (the projections of the updates on the last global delta).
#: Two sites at least: one site measures no dispersion, so its noise scale would freeze.
#: k0 and the window are the paper's at up to 100 sites and grow in proportion beyond
#: (docs/scale.md: at 150 sites a ramp of 5 sites a round from 10 missed the target).
PROJECT_GREEDY = replace(
    NOISE_GREEDY, gain=GainModel.NOISE_DIRECTIONAL, min_sites=2, reference_sites=100
)

VARIANTS: dict[str, GreedyConfig] = {
    "powertrip": PROJECT_GREEDY,
    "powertrip-paper": PAPER_GREEDY,
    "powertrip-noise": NOISE_GREEDY,
    "powertrip-directional": PROJECT_GREEDY,
    "powertrip-split": replace(NOISE_GREEDY, gain=GainModel.SPLIT_HALF, min_sites=2),
    "powertrip-split-acc": replace(NOISE_GREEDY, gain=GainModel.SPLIT_HALF_ACCURACY, min_sites=2),
    "powertrip-prefix": replace(PAPER_GREEDY, search=SearchMode.INCREMENTAL_PREFIX),
    "powertrip-kappa": replace(PAPER_GREEDY, gain=GainModel.KAPPA_HEADROOM),
    "powertrip-maxest": replace(PAPER_GREEDY, estimator=Estimator.MAX),
    "highest-power": replace(PAPER_GREEDY, ranking=RankingConfig(ranking=Ranking.POWER)),
    "lowest-latency": replace(PAPER_GREEDY, ranking=RankingConfig(ranking=Ranking.LATENCY)),
}


def configured(config: GreedyConfig, context: PolicyContext) -> GreedyConfig:
    """A variant as a run configures it. The project's variants estimate a round with the
    system's own time model (the straggler max for synchronous per-site rounds, Eq. 7 when work
    is spread over the sites' power); the paper's keep Algorithm 1's mean-power estimate
    whatever the system. Then the run's overrides, which ``GreedyConfig`` checks."""
    if config.estimator is Estimator.MAX and context.round_time_model is RoundTimeModel.AGGREGATE:
        config = replace(config, estimator=Estimator.AGGREGATE)
    return replace(config, **context.greedy_overrides)


def _variant(config: GreedyConfig) -> PolicyFactory:
    return lambda name, context: PowerTripGreedy(configured(config, context), name=name)


for _name, _config in VARIANTS.items():
    register_policy(_name, _variant(_config))
