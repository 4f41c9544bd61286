"""EcoLearn-style carbon-aware selection (Mehboob et al., "EcoLearn: Optimizing the Carbon
Footprint of Federated Learning", arXiv 2310.17972): Oort's utility, made carbon-aware.

EcoLearn's selection picks "clients with high data utility and low carbon" on top of Oort, and
provisions more clients in the first (critical) rounds. Here, each round:

    K_r  = ceil(K * warmup_factor)  for r <= warmup_rounds, else K     (early over-provisioning)
    pool = the ceil(rho * K_r) sites of highest Oort score            (utility filter)
    pick = the K_r sites of lowest carbon intensity I_i in the pool    (carbon greedy)

Oort's score is its util_i (statistical utility, staleness bonus, speed penalty); unexplored
sites rank after explored ones by speed, so the pool always has ceil(rho K_r) sites. rho is the
utility / carbon trade-off: rho = 1 is Oort's ranking alone, rho >= N / K_r picks the K_r
lowest-carbon sites whatever their utility. docs/selectors.md says what is simplified.

Carbon intensity: a ``CarbonSiteProfile``'s ``intensity`` (the curtailment study's per-site
grid intensity) when the round's profile has one; otherwise (the standard PowerTrip study, whose
sites have no grid) each site i sits in region ``i mod regions`` of the embedded synthetic
carbon trace (``powertrip.footprint.SiteGrid``, seed ``carbon_seed``: the grid the study's footprint
is priced on), read at
the round's clock time: deterministic, time-varying, the same for every policy and repeat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from powertrip.selection.base import RoundContext
from powertrip.selection.oort import (
    OortConfig,
    OortUtility,
    OortUtilityPolicy,
    participants,
    site_round_times,
)
from powertrip.selection.registration import register_policy
from powertrip.sites.grid import SiteGrid


@dataclass(frozen=True)
class EcoLearnConfig:
    oort: OortConfig = field(default_factory=OortConfig)
    pool_factor: float = 2.0  # rho >= 1: utility pool size as a multiple of K
    warmup_rounds: int = 5  # rounds of early over-provisioning
    warmup_factor: float = 1.5  # K multiplier during them
    regions: int = 5  # synthetic carbon regions when the profile has no intensity
    carbon_seed: int = 0
    carbon_hours: float = 72.0  # synthetic trace length (held at its last sample after)

    def __post_init__(self) -> None:
        if self.pool_factor < 1 or self.warmup_factor < 1 or self.warmup_rounds < 0:
            raise ValueError("ecolearn needs pool_factor >= 1, warmup_factor >= 1, rounds >= 0")
        if self.regions < 1:
            raise ValueError("ecolearn needs at least one carbon region")


def site_carbon(ctx: RoundContext, fallback: SiteGrid) -> NDArray[np.float64]:
    """gCO2/kWh of every site now: the profile's own intensity if it carries one."""
    own = getattr(ctx.profile, "intensity", None)
    if own is not None:
        return np.asarray(own, dtype=np.float64)
    return fallback.intensity(ctx.profile.size, ctx.now_s)


class EcoLearn(OortUtilityPolicy):
    """Oort's utility pool, then the lowest-carbon sites in it; more sites in early rounds. Its
    state is Oort's utility; the carbon grid is configuration (rebuilt from its seed)."""

    def __init__(self, cfg: EcoLearnConfig | None = None, name: str = "ecolearn") -> None:
        self.cfg = cfg or EcoLearnConfig()
        self.state = OortUtility(self.cfg.oort)
        self.carbon = SiteGrid(self.cfg.regions, self.cfg.carbon_seed, self.cfg.carbon_hours)
        self.name = name

    def round_k(self, ctx: RoundContext) -> int:
        k = participants(self.cfg.oort.k, ctx.profile.size)
        if ctx.round <= self.cfg.warmup_rounds:
            k = participants(math.ceil(k * self.cfg.warmup_factor), ctx.profile.size)
        return k

    @staticmethod
    def utility_order(util: dict[int, float], times: NDArray[np.float64]) -> NDArray[np.int64]:
        """Sites by Oort score, best first: explored by util_i (ties by index), then unexplored
        by speed (fastest first)."""
        explored = sorted(util, key=lambda s: (-util[s], s))
        fresh = [s for s in np.argsort(times, kind="stable").tolist() if s not in util]
        return np.asarray(explored + fresh, dtype=np.int64)

    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        n, k = ctx.profile.size, self.round_k(ctx)
        times = site_round_times(ctx)
        util = self.state.scores(ctx.round, times)
        order = self.utility_order(util, times)
        # Oort's eps-greedy split of the pool: (1 - eps) of it exploited (best util_i), the
        # rest explored (unexplored sites sampled by speed 1 / t_i).
        size = min(n, math.ceil(self.cfg.pool_factor * k))
        explored = [s for s in order.tolist() if s in util]
        n_exploit = min(int(size * (1 - self.state.exploration)), len(explored))
        fresh = [s for s in order.tolist() if s not in util]
        if fresh:
            speed = 1.0 / times[fresh]
            n_explore = min(size - n_exploit, len(fresh))
            explore = ctx.rng.choice(fresh, n_explore, replace=False, p=speed / speed.sum())
        else:
            explore = np.empty(0, dtype=np.int64)
        pool = np.asarray(explored[:n_exploit] + np.asarray(explore).tolist(), dtype=np.int64)
        if pool.size < size:  # top up from the rest of the ranking
            rest = [s for s in order.tolist() if s not in set(pool.tolist())]
            pool = np.concatenate([pool, np.asarray(rest[: size - pool.size], dtype=np.int64)])
        carbon = site_carbon(ctx, self.carbon)
        chosen = pool[np.lexsort((pool, carbon[pool]))][:k]  # lowest carbon, ties by index
        self.state.decay()
        return np.sort(chosen).astype(np.int64)


register_policy("ecolearn", lambda name, ctx: EcoLearn())  # its paper's defaults
