"""Ranking sites (Eq. 8 and single-metric variants) and estimating a round's time for a prefix.

Both work on whole arrays: a ranking is a permutation of site indices, best first, and an
estimator returns T_hat(k) for every prefix length k = 1..N at once, so a policy can scan all
candidate site counts in O(N).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import ParamSpec

import numpy as np
from numpy.typing import NDArray

from powertrip.selection.topk import full_order
from powertrip.sites.profiles import SiteProfile

GB = 1e9  # update sizes are in decimal gigabytes
P = ParamSpec("P")


class Ranking(StrEnum):
    POWER_TO_COST = "power-to-cost"  # Eq. 8, the paper's
    POWER = "power"  # highest-power baseline
    LATENCY = "latency"  # lowest-latency baseline
    ROUND_TIME = "round-time"  # project's own: the site's own tau/P_i + C_i, fastest first


class ScoreForm(StrEnum):
    DIFFERENCE = "difference"  # Eq. 8: alpha*P~ - beta*C~ (the default)
    EXPONENT = "exponent"  # alternative form: P^alpha / C^beta


class WeightSchedule(StrEnum):
    # Eq. 8 weights by update size: 1 GB -> (0.7, 0.3), 1.5 GB -> (0.5, 0.5), 2 GB -> (0.3, 0.7)
    LINEAR = "linear"
    COMPUTE_SHARE = "compute-share"  # alpha = tau / (tau + M/B_med)


class Estimator(StrEnum):
    MEAN_POWER = "mean-power"  # Algorithm 1 as written: tau / mean P + max C
    MAX = "max"  # straggler-exact under the per-site-max ground truth (project's own)
    AGGREGATE = "aggregate"  # Eq. 7: N*tau / sum P + max C


def score_weights(
    update_bytes: float,
    schedule: WeightSchedule = WeightSchedule.LINEAR,
    ideal_compute_s: float | None = None,
    median_bandwidth_bps: float | None = None,
) -> tuple[float, float]:
    """(alpha, beta) with alpha + beta = 1: small updates favour power, large ones latency."""
    if update_bytes < 0:
        raise ValueError(f"update size must be >= 0 bytes, got {update_bytes}")
    if WeightSchedule(schedule) is WeightSchedule.LINEAR:
        alpha = 0.7 - 0.4 * float(np.clip((update_bytes - GB) / GB, 0.0, 1.0))
    else:
        if not ideal_compute_s or not median_bandwidth_bps:
            raise ValueError(
                "compute-share weights need the ideal compute time and median bandwidth"
            )
        transfer = update_bytes * 8 / median_bandwidth_bps
        alpha = ideal_compute_s / (ideal_compute_s + transfer)
    return alpha, 1.0 - alpha


def power_to_cost_scores(
    power: NDArray[np.float64],
    comm_s: NDArray[np.float64],
    alpha: float,
    beta: float,
    form: ScoreForm = ScoreForm.DIFFERENCE,
) -> NDArray[np.float64]:
    """Eq. 8, S_i = alpha * P_i/max P - beta * C_i/max C; higher is better."""
    p = np.asarray(power, dtype=np.float64)
    c = np.asarray(comm_s, dtype=np.float64)
    if ScoreForm(form) is ScoreForm.EXPONENT:
        return p**alpha / np.maximum(c, 1e-12) ** beta
    p_norm = p / p.max() if p.max() > 0 else p
    c_norm = c / c.max() if c.max() > 0 else c
    return alpha * p_norm - beta * c_norm


def rank_key(
    profile: SiteProfile,
    ranking: Ranking,
    alpha: float = 0.5,
    beta: float = 0.5,
    ideal_compute_s: float = 1.0,
    form: ScoreForm = ScoreForm.DIFFERENCE,
) -> NDArray[np.float64]:
    """The sort key of ``rank_sites`` (ascending = best), a new array: kept apart from the sort so a
    policy can rank only the prefix it needs (``powertrip.selection.topk``)."""
    ranking = Ranking(ranking)
    if ranking is Ranking.POWER_TO_COST:
        return -power_to_cost_scores(profile.power, profile.comm_s, alpha, beta, form)
    if ranking is Ranking.POWER:
        return -np.asarray(profile.power, dtype=np.float64)
    if ranking is Ranking.LATENCY:
        return np.array(profile.comm_s, dtype=np.float64)  # a copy: the memo must not alias it
    return ideal_compute_s / profile.power + profile.comm_s


def _sorted(key: Callable[P, NDArray[np.float64]]) -> Callable[P, NDArray[np.int64]]:
    """``rank_sites``: the sites sorted by ``key``, which it takes the parameters of (declared
    once, typed so)."""

    def rank_sites(*args: P.args, **kwargs: P.kwargs) -> NDArray[np.int64]:
        """Site indices, best first, under the chosen ranking; takes ``rank_key``'s arguments."""
        return full_order(key(*args, **kwargs))

    return rank_sites


rank_sites = _sorted(rank_key)


def prefix_round_times(
    profile: SiteProfile,
    order: NDArray[np.int64],
    ideal_compute_s: float,
    estimator: Estimator,
) -> NDArray[np.float64]:
    """T_hat(k) for k = 1..N when the round uses the first k sites of ``order``."""
    p = profile.power[order]
    c = profile.comm_s[order]
    k = np.arange(1, p.size + 1)
    max_comm = np.maximum.accumulate(c)
    estimator = Estimator(estimator)
    if estimator is Estimator.MEAN_POWER:
        return ideal_compute_s / (np.cumsum(p) / k) + max_comm
    if estimator is Estimator.MAX:
        return np.maximum.accumulate(ideal_compute_s / p + c)
    return profile.size * ideal_compute_s / np.cumsum(p) + max_comm
