"""Which sites train this round: one small interface, every selection policy behind it.

A policy sees a ``RoundContext`` (fresh site profiles, the clock) before the round and a
``RoundFeedback`` (measured duration, accuracy, update dispersion) after it. The emulator and the
aggregator service drive policies the same way, so a study result is the deployed behaviour.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from powertrip import state_dict as sd
from powertrip.selection.registration import PolicyMode, register_policy
from powertrip.selection.scoring import (
    Ranking,
    ScoreForm,
    WeightSchedule,
    rank_key,
    score_weights,
)
from powertrip.selection.topk import full_order, top_order
from powertrip.sites.forecast import Forecaster
from powertrip.sites.profiles import SiteProfile


@dataclass(frozen=True)
class RoundContext:
    round: int
    now_s: float
    profile: SiteProfile
    ideal_compute_s: float  # tau: one local-training pass at 100% power (measured or emulated)
    update_bytes: float
    rng: np.random.Generator
    #: each site's predicted mean power over [now, now + horizon] (``powertrip.sites.forecast``),
    #: when the run asks for a forecast; None (the default) for every run that does not
    forecast: Forecaster | None = None
    #: the run's target accuracy and the rounds left in its budget (this one included), when the
    #: round loop has them; a budget-aware policy grows its count to finish in time
    target_accuracy: float | None = None
    rounds_left: int | None = None


@dataclass(frozen=True)
class RoundFeedback:
    round: int
    selected: NDArray[np.int64]
    duration_s: float
    accuracy: float
    previous_accuracy: float
    # Update dispersion, for noise-aware gain models: weighted mean of |delta_i|^2, the squared norm
    # of the weighted mean delta, and the effective number of sites (sum w)^2 / sum w^2.
    mean_sq_norm: float | None = None
    sq_norm_of_mean: float | None = None
    effective_sites: float | None = None
    # Split-half probe: validation loss before and after the round, and of the model averaged
    # from every other selected site only (with its effective number of sites).
    loss: float | None = None
    previous_loss: float | None = None
    half_loss: float | None = None
    half_sites: float | None = None
    half_accuracy: float | None = None
    # Projections p_i = delta_i . u on the previous round's unit global delta u (same weights):
    # weighted mean of p_i and of p_i^2. None when the executor had no previous delta.
    mean_proj: float | None = None
    mean_sq_proj: float | None = None


class SiteRanking(Protocol):
    """Orders a round's sites best first: the seam where Algorithm 1 takes its ranking."""

    def order(self, ctx: RoundContext) -> NDArray[np.int64]: ...


@dataclass(frozen=True)
class RankingConfig:
    """How a policy orders sites; Eq. 8 weights follow the update size unless fixed."""

    ranking: Ranking = Ranking.POWER_TO_COST
    weights: WeightSchedule = WeightSchedule.LINEAR
    form: ScoreForm = ScoreForm.DIFFERENCE
    alpha: float | None = None  # fixed alpha overrides the schedule

    def alpha_beta(self, ctx: RoundContext) -> tuple[float, float]:
        """(alpha, beta) of Eq. 8 for this round."""
        if self.alpha is not None:
            return self.alpha, 1.0 - self.alpha
        if Ranking(self.ranking) is Ranking.POWER_TO_COST:
            bw = None
            if WeightSchedule(self.weights) is WeightSchedule.COMPUTE_SHARE:
                # comm = latency + 8M/B, so the median link's transfer share recovers B_med.
                bw = ctx.update_bytes * 8 / max(float(np.median(ctx.profile.comm_s)), 1e-12)
            return score_weights(ctx.update_bytes, self.weights, ctx.ideal_compute_s, bw)
        return 0.5, 0.5

    def key(self, ctx: RoundContext) -> NDArray[np.float64]:
        """Each site's sort key, ascending = best (see ``rank_key``)."""
        alpha, beta = self.alpha_beta(ctx)
        return rank_key(ctx.profile, self.ranking, alpha, beta, ctx.ideal_compute_s, self.form)

    def order(self, ctx: RoundContext) -> NDArray[np.int64]:
        return full_order(self.key(ctx))

    def top(self, ctx: RoundContext, m: int) -> NDArray[np.int64]:
        """``order(ctx)[:m]`` without sorting every site."""
        return top_order(self.key(ctx), m)


class SelectionPolicy(ABC):
    """Base class: ``select`` returns site indices for the round; ``observe`` learns from it."""

    name: str = "policy"
    #: set for the centralized baselines: one co-located site at this power fraction, no network.
    centralized_power: float | None = None
    #: ask the executor for the split-half probe (a second, half-size FedAvg) in the feedback
    wants_split_half: bool = False
    #: ask the executor for the updates' projections on the previous round's global delta
    wants_direction: bool = False

    @abstractmethod
    def select(self, ctx: RoundContext) -> NDArray[np.int64]: ...

    def observe(self, feedback: RoundFeedback) -> None:  # noqa: B027 - optional hook
        """Default: stateless policies ignore feedback."""

    def state_dict(self) -> dict[str, Any]:
        """What the policy learnt so far, in PyTorch's ``state_dict`` shape (plain numbers,
        lists, dicts and numpy arrays, copies): a policy rebuilt from the run's configuration
        and given this state selects exactly as this one would (a checkpoint holds it, so a
        resume replays nothing). Its configuration is not in it, nor memos that only save time,
        nor diagnostics that grow with the run (``k_history``). Stateless policies: {}."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``'s value; TypeError (a field of the wrong type) or
        ValueError (a state of another policy) naming the field, leaving this one unchanged."""
        sd.fields(state, f"policy {self.name} state", set())


def feedback_state(fb: RoundFeedback | None) -> dict[str, Any] | None:
    """A round's feedback as a state (its ``RoundFeedback`` fields; extras of a subclass, such
    as the per-site losses, are dropped: no policy reads them after ``observe``)."""
    if fb is None:
        return None
    return {
        "round": int(fb.round),
        "selected": np.asarray(fb.selected, dtype=np.int64).copy(),
        **{k: None if v is None else float(v) for k, v in _feedback_numbers(fb).items()},
    }


def _feedback_numbers(fb: RoundFeedback) -> dict[str, float | None]:
    skip = {"round", "selected"}
    return {f.name: getattr(fb, f.name) for f in fields(RoundFeedback) if f.name not in skip}


_OPTIONAL = {f.name for f in fields(RoundFeedback)} - {
    "round",
    "selected",
    "duration_s",
    "accuracy",
    "previous_accuracy",
}


def feedback_from(state: object, where: str) -> RoundFeedback | None:
    """``feedback_state``'s value back (None for None)."""
    if state is None:
        return None
    names = {f.name for f in fields(RoundFeedback)}
    d = sd.fields(state, where, names)
    values: dict[str, Any] = {
        k: sd.number(d[k], f"{where}.{k}", optional=k in _OPTIONAL)
        for k in names - {"round", "selected"}
    }
    return RoundFeedback(
        round=sd.integer(d["round"], f"{where}.round"),  # type: ignore[arg-type]
        selected=sd.array(d["selected"], f"{where}.selected", np.int64),
        **values,
    )


class StaticTopK(SelectionPolicy):
    """The same k best-ranked sites every round (static-k, and static-optimal after a sweep)."""

    def __init__(self, k: int, ranking: RankingConfig | None = None, name: str | None = None):
        if k < 1:
            raise ValueError(f"static top-k needs k >= 1, got {k}")
        self.k = k
        self.ranking = ranking or RankingConfig()
        self.name = name or f"static-{k}"

    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        return self.ranking.top(ctx, min(self.k, ctx.profile.size))


class SelectAll(SelectionPolicy):
    name = "select-all"

    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        return np.arange(ctx.profile.size, dtype=np.int64)


class FixedRadius(SelectionPolicy):
    """Every site within a radius of the aggregator (the paper's 1000 mi / 22 sites)."""

    def __init__(self, radius_mi: float = 1000.0):
        if radius_mi <= 0:
            raise ValueError(f"radius must be > 0 mi, got {radius_mi}")
        self.radius_mi = radius_mi
        self.name = "fixed-radius"

    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        inside = np.flatnonzero(ctx.profile.distance_mi <= self.radius_mi).astype(np.int64)
        if inside.size == 0:  # never an empty round: fall back to the nearest site
            inside = np.array([int(np.argmin(ctx.profile.distance_mi))], dtype=np.int64)
        return inside


class RandomK(SelectionPolicy):
    """A fresh uniform sample of k sites each round (the random baseline, with k = k*)."""

    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"random-k needs k >= 1, got {k}")
        self.k = k
        self.name = "random"

    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        k = min(self.k, ctx.profile.size)
        return np.sort(ctx.rng.choice(ctx.profile.size, size=k, replace=False)).astype(np.int64)


class Centralized(SelectionPolicy):
    """The centralized baseline: every partition trained at one site capped at P_c, with no
    communication."""

    def __init__(self, power_fraction: float):
        if not 0 < power_fraction <= 1:
            raise ValueError(f"centralized power must be in (0, 1], got {power_fraction}")
        self.centralized_power = power_fraction
        self.name = f"centralized-{round(power_fraction * 100)}"

    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        return np.arange(ctx.profile.size, dtype=np.int64)


# -- the baselines a run builds by name (docs/selectors.md) -------------------------------------
register_policy("static-optimal", lambda name, ctx: StaticTopK(ctx.need_k_star(name), name=name))
register_policy("static-<k>", lambda name, ctx: StaticTopK(int(name.removeprefix("static-"))))
register_policy("select-all", lambda name, ctx: SelectAll())
register_policy("fixed-radius", lambda name, ctx: FixedRadius(ctx.radius_mi))
register_policy("random", lambda name, ctx: RandomK(ctx.need_k_star(name)))
for _name in ("centralized-25", "centralized-50"):
    register_policy(
        _name, lambda name, ctx: Centralized(int(name.removeprefix("centralized-")) / 100)
    )
# the curtailment study's run in which every connected site trains
register_policy("curtailment", lambda name, ctx: SelectAll(), modes=[PolicyMode.CURTAILMENT])
