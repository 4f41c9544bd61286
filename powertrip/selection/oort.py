"""Oort (Lai et al., "Oort: Efficient Federated Learning via Guided Participant Selection",
OSDI 2021) as a selection policy: Algorithm 1 of the paper, with the constants and the
normalisation of its reference implementation (FedScale's Oort selector). docs/selectors.md.

Each round R a site i that has trained before ("explored") scores

    util_i = U_i' + sqrt(0.1 ln R / L_i)                 (statistical utility + staleness bonus)
    util_i *= (T / t_i)^alpha      if t_i > T            (system penalty, alpha = 2)

with U_i = |B_i| sqrt(1/|B_i| sum_k loss_k^2) its last statistical utility (U_i' min-max
normalised over the explored sites, as FedScale does), L_i the last round it trained, t_i its
round time from the profile (tau / P_i + comm_i) and T the preferred round duration: the
pacer's percentile of the sites' round times, raised by ``pacer_delta`` points whenever the
utility of the last ``pacer_step`` rounds falls below that of the ``pacer_step`` before.
(1 - eps) K sites are exploited, sampled by utility among those within 95% of the cut-off
utility; eps K unexplored sites are explored, sampled by speed 1/t_i; eps decays by
``exploration_decay`` a round down to ``exploration_min``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from powertrip import state_dict as sd
from powertrip.selection.base import RoundContext, RoundFeedback, SelectionPolicy
from powertrip.selection.registration import register_policy

#: the participants K per round when none is given: this share of the sites (at least one)
DEFAULT_SHARE = 0.2


def participants(k: int | None, n: int) -> int:
    """K of a round: ``k`` capped at the number of sites, or ``DEFAULT_SHARE`` of them."""
    if k is None:
        k = math.ceil(DEFAULT_SHARE * n)
    return max(1, min(int(k), n))


def site_round_times(ctx: RoundContext) -> NDArray[np.float64]:
    """t_i = tau / P_i + comm_i: each site's round time if it trained alone (Eq. 4's term)."""
    p = ctx.profile
    return ctx.ideal_compute_s / np.maximum(p.power, 1e-12) + p.comm_s


@dataclass(frozen=True)
class OortConfig:
    k: int | None = None  # participants per round (None: DEFAULT_SHARE of the sites)
    alpha: float = 2.0  # straggler penalty exponent (paper §4.2, FedScale round_penalty)
    exploration: float = 0.9  # initial eps (FedScale exploration_factor)
    exploration_decay: float = 0.98
    exploration_min: float = 0.3
    staleness: float = 0.1  # the 0.1 in sqrt(0.1 ln R / L_i)
    cut_off: float = 0.95  # exploit among util >= 95% of the cut-off utility
    pacer_step: int = 20  # W: rounds per pacer window
    pacer_delta: float = 5.0  # Delta: percentile points T is relaxed by
    round_threshold: float = 30.0  # initial T: this percentile of the sites' round times
    clip_bound: float = 0.95  # utilities clipped at this quantile before normalising

    def __post_init__(self) -> None:
        if not 0 <= self.exploration_min <= self.exploration <= 1:
            raise ValueError("oort needs 0 <= exploration_min <= exploration <= 1")
        if self.alpha < 0 or self.pacer_step < 1 or not 0 <= self.round_threshold <= 100:
            raise ValueError("oort needs alpha >= 0, pacer_step >= 1, threshold in [0, 100]")


class OortUtility:
    """Per-site statistical utility, last round trained and the pacer (shared with the
    EcoLearn and FedZero policies, which score sites with Oort's utility)."""

    def __init__(self, cfg: OortConfig) -> None:
        self.cfg = cfg
        self.utility: dict[int, float] = {}  # U_i of explored sites
        self.last_round: dict[int, int] = {}  # L_i
        # the sum of U_i of each of the last 2 W rounds' participants (all the pacer reads),
        # and how many rounds were observed in all
        self.round_utility: list[float] = []
        self.rounds_observed = 0
        self.threshold = cfg.round_threshold
        self.exploration = cfg.exploration

    def observe(self, fb: RoundFeedback) -> None:
        """U_i = n_i * loss_i of each site that trained (see ``site_utilities``)."""
        total = 0.0
        for site, u in zip(fb.selected.tolist(), site_utilities(fb), strict=True):
            if not np.isfinite(u):  # its update never arrived (services: NaN): nothing measured
                continue
            self.utility[site], self.last_round[site] = u, fb.round
            total += u
        self.round_utility.append(total)
        del self.round_utility[: -2 * self.cfg.pacer_step]
        self.rounds_observed += 1
        self._pace()

    def _pace(self) -> None:
        """Pacer: relax T by Delta percentile points when the last W rounds' utility stalls."""
        w, hist = self.cfg.pacer_step, self.round_utility
        full = self.rounds_observed >= 2 * w and self.rounds_observed % w == 0
        if full and sum(hist[-2 * w : -w]) > sum(hist[-w:]):
            self.threshold = min(100.0, self.threshold + self.cfg.pacer_delta)

    def preferred_duration(self, times: NDArray[np.float64]) -> float:
        """T: the pacer's percentile of the sites' round times (FedScale's round_threshold)."""
        ordered = np.sort(times)
        return float(ordered[min(int(self.threshold / 100 * ordered.size), ordered.size - 1)])

    def scores(self, round_index: int, times: NDArray[np.float64]) -> dict[int, float]:
        """util_i of every explored site this round (normalised utility + staleness bonus,
        times the system penalty (T / t_i)^alpha where t_i > T)."""
        if not self.utility:
            return {}
        cfg = self.cfg
        sites = np.fromiter(self.utility, dtype=np.int64)
        u = np.fromiter(self.utility.values(), dtype=np.float64)
        u = np.minimum(u, np.quantile(u, cfg.clip_bound))
        lo, span = float(u.min()), float(u.max() - u.min())
        u = (u - lo) / span if span > 0 else np.zeros_like(u)
        last = np.array([self.last_round[s] for s in sites.tolist()], dtype=np.float64)
        u = u + np.sqrt(cfg.staleness * math.log(max(round_index, 1)) / np.maximum(last, 1))
        t_pref, t = self.preferred_duration(times), times[sites]
        slow = t > t_pref
        u[slow] *= (t_pref / t[slow]) ** cfg.alpha
        return dict(zip(sites.tolist(), u.tolist(), strict=True))

    def state_dict(self) -> dict[str, Any]:
        """The explored sites (in the order they were first explored) with U_i and L_i, the
        pacer's recent round utilities and count, T's percentile and eps."""
        sites = list(self.utility)
        return {
            "sites": np.asarray(sites, dtype=np.int64),
            "utility": np.asarray([self.utility[s] for s in sites], dtype=np.float64),
            "last_round": np.asarray([self.last_round[s] for s in sites], dtype=np.int64),
            "round_utility": [float(u) for u in self.round_utility],
            "rounds_observed": self.rounds_observed,
            "threshold": float(self.threshold),
            "exploration": float(self.exploration),
        }

    def load_state_dict(self, state: Mapping[str, Any], where: str) -> None:
        keys = {"sites", "utility", "last_round", "round_utility", "rounds_observed"}
        d = sd.fields(state, where, keys | {"threshold", "exploration"})
        sites = sd.array(d["sites"], f"{where}.sites", np.int64).tolist()
        utility = sd.array(d["utility"], f"{where}.utility", np.float64).tolist()
        last = sd.array(d["last_round"], f"{where}.last_round", np.int64).tolist()
        if not len(sites) == len(utility) == len(last) or len(set(sites)) != len(sites):
            raise ValueError(f"{where}: sites, utility and last_round do not pair up")
        recent = sd.numbers(d["round_utility"], f"{where}.round_utility")
        observed = sd.integer(d["rounds_observed"], f"{where}.rounds_observed")
        assert observed is not None
        if len(recent) != min(observed, 2 * self.cfg.pacer_step):
            raise ValueError(f"{where}.round_utility is not the last rounds' of {observed}")
        threshold = sd.number(d["threshold"], f"{where}.threshold")
        exploration = sd.number(d["exploration"], f"{where}.exploration")
        self.utility = dict(zip(sites, utility, strict=True))
        self.last_round = dict(zip(sites, last, strict=True))
        self.round_utility, self.rounds_observed = recent, observed
        self.threshold, self.exploration = threshold, exploration  # type: ignore[assignment]

    def decay(self) -> None:
        self.exploration = max(
            self.exploration * self.cfg.exploration_decay, self.cfg.exploration_min
        )


def site_utilities(fb: RoundFeedback) -> NDArray[np.float64]:
    """|B_i| sqrt(mean loss^2) per selected site. The emulator reports each site's mean training
    loss over its local steps and its sample count (``SiteFeedback``); the mean loss stands in
    for the root mean square of the per-sample losses (mean <= RMS, equal for constant loss).
    An executor without per-site losses gives every site the round's validation loss."""
    k = fb.selected.size
    loss = getattr(fb, "site_loss", None)
    samples = getattr(fb, "site_samples", None)
    if loss is None or len(loss) != k:
        loss = np.full(k, fb.loss if fb.loss is not None else 1.0)
    if samples is None or len(samples) != k:
        samples = np.ones(k)
    return np.asarray(samples, dtype=np.float64) * np.abs(np.asarray(loss, dtype=np.float64))


def oort_pick(
    state: OortUtility,
    ctx: RoundContext,
    k: int,
    times: NDArray[np.float64],
    eligible: NDArray[np.bool_] | None = None,
) -> NDArray[np.int64]:
    """Algorithm 1's participant sampling over the ``eligible`` sites (all by default)."""
    rng, n = ctx.rng, ctx.profile.size
    ok = np.ones(n, dtype=bool) if eligible is None else eligible
    k = min(k, int(ok.sum()))
    util = {s: u for s, u in state.scores(ctx.round, times).items() if ok[s]}
    explored = sorted(util, key=lambda s: (-util[s], s))
    n_exploit = min(int(k * (1.0 - state.exploration)), len(explored))
    picked: list[int] = []
    if n_exploit > 0:
        cut = util[explored[n_exploit - 1]] * state.cfg.cut_off
        pool = [s for s in explored if util[s] >= cut]
        weight = np.array([max(util[s], 0.0) for s in pool])
        prob = weight / weight.sum() if weight.sum() > 0 else None
        picked = rng.choice(pool, size=n_exploit, replace=False, p=prob).tolist()
    fresh = np.array([s for s in range(n) if ok[s] and s not in util], dtype=np.int64)
    n_explore = min(k - len(picked), fresh.size)
    if n_explore > 0:
        speed = 1.0 / times[fresh]
        picked += rng.choice(fresh, size=n_explore, replace=False, p=speed / speed.sum()).tolist()
    if len(picked) < k:  # nothing left to explore: the best remaining explored sites
        chosen = set(picked)
        picked += [s for s in explored if s not in chosen][: k - len(picked)]
    state.decay()
    return np.sort(np.asarray(picked, dtype=np.int64))


class OortUtilityPolicy(SelectionPolicy):
    """A policy that learns Oort's utility (``self.state``) from every round and keeps it as its
    whole state (Oort, and EcoLearn on top of it); what it configures is rebuilt, not kept."""

    state: OortUtility

    def observe(self, feedback: RoundFeedback) -> None:
        self.state.observe(feedback)

    def state_dict(self) -> dict[str, Any]:
        return {"utility": self.state.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        where = f"policy {self.name} state"
        d = sd.fields(state, where, {"utility"})
        self.state.load_state_dict(d["utility"], f"{where}.utility")


class Oort(OortUtilityPolicy):
    """Oort's guided participant selection: K sites a round by statistical x system utility."""

    def __init__(self, cfg: OortConfig | None = None, name: str = "oort") -> None:
        self.cfg = cfg or OortConfig()
        self.state = OortUtility(self.cfg)
        self.name = name

    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        k = participants(self.cfg.k, ctx.profile.size)
        return oort_pick(self.state, ctx, k, site_round_times(ctx))


register_policy("oort", lambda name, ctx: Oort())  # its paper's defaults
