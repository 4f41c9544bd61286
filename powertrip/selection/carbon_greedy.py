"""PowerTrip's choice of sites inside the curtailment system (docs/curtailment.md), and the
curtailment study's policies by name.

The ranking is Eq. 8 with the sites' carbon intensity as a third, weighted term,
``S_i = (1 - γ)(α·P̃_i - β·C̃_i) - γ·Ĩ_i`` (each term normalised by its maximum over the pool),
and Algorithm 1 runs over the sites that are currently available only, estimating a round with
the wall-clock round model instead of E_loc epochs. γ = 0 is the paper's Eq. 8. The wall-clock
rounds come from the curtailment run (``PolicyContext.wall_clock``), so the policy lives here
with the others, below the curtailment system that drives it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from powertrip.selection.base import RoundContext
from powertrip.selection.greedy import PAPER_GREEDY, PowerTripGreedy
from powertrip.selection.registration import (
    PolicyContext,
    PolicyMode,
    WallClockTimer,
    register_policy,
)
from powertrip.selection.scoring import power_to_cost_scores, score_weights
from powertrip.sites.profiles import SiteProfile


@dataclass(frozen=True)
class CarbonSiteProfile(SiteProfile):
    intensity: NDArray[np.float64]  # gCO2/kWh of each site's grid now


def carbon_profile(ctx: RoundContext) -> CarbonSiteProfile:
    """The round's profile with the sites' carbon intensity; the carbon-aware ranking cannot
    rank without it, so a plain ``SiteProfile`` is a wiring error, not an Eq. 8 fallback."""
    if not isinstance(ctx.profile, CarbonSiteProfile):
        raise TypeError(
            "the carbon-aware ranking needs a CarbonSiteProfile (sites' carbon intensity) in "
            f"the round context, got {type(ctx.profile).__name__}"
        )
    return ctx.profile


@dataclass(frozen=True)
class CarbonRanking:
    """Eq. 8 with a carbon term; a ``SiteRanking`` for Algorithm 1 over CarbonSiteProfiles."""

    carbon_weight: float = 0.0  # γ in [0, 1]

    def __post_init__(self) -> None:
        if not 0 <= self.carbon_weight <= 1:
            raise ValueError(f"carbon weight must be in [0, 1], got {self.carbon_weight}")

    def scores(self, ctx: RoundContext) -> NDArray[np.float64]:
        p = carbon_profile(ctx)
        alpha, beta = score_weights(ctx.update_bytes)
        score = power_to_cost_scores(p.power, p.comm_s, alpha, beta)
        if self.carbon_weight == 0:
            return score
        top = float(np.max(p.intensity))
        carbon = p.intensity / top if top > 0 else np.zeros_like(p.intensity)
        return (1 - self.carbon_weight) * score - self.carbon_weight * carbon

    def order(self, ctx: RoundContext) -> NDArray[np.int64]:
        """Best first; ties by site position, so the order is deterministic."""
        s = self.scores(ctx)
        return np.lexsort((np.arange(s.size), -s)).astype(np.int64)


class WallClockGreedy(PowerTripGreedy):
    """Algorithm 1 (as reconstructed, log gain) whose round-time estimate is the wall-clock
    round: with a fixed minimum length, a site only lengthens a round by the overrun of its
    last step and by its upload."""

    def __init__(self, rounds: WallClockTimer, carbon_weight: float = 0.0, name: str = ""):
        super().__init__(
            replace(PAPER_GREEDY, ranking=CarbonRanking(carbon_weight)),
            name=name or ("powertrip-carbon" if carbon_weight else "powertrip"),
        )
        self.rounds = rounds

    def prefix_times(self, ctx: RoundContext, order: NDArray[np.int64]) -> NDArray[np.float64]:
        p = ctx.profile
        return np.maximum.accumulate(self.rounds.site_round_s(p.power[order], p.comm_s[order]))


# -- the curtailment study's runs that choose sites (docs/curtailment.md) ------------------------
def _eq8_greedy(name: str, ctx: PolicyContext) -> WallClockGreedy:
    """``powertrip`` in a curtailment run: Algorithm 1 over Eq. 8 alone."""
    return WallClockGreedy(ctx.need_curtailment(name)[1], 0.0, name=name)


def _carbon_greedy(name: str, ctx: PolicyContext) -> WallClockGreedy:
    """``combined``: Algorithm 1 over Eq. 8 with the run's carbon weight γ."""
    cfg, rounds = ctx.need_curtailment(name)
    return WallClockGreedy(rounds, cfg.carbon_weight, name=name)


register_policy("powertrip", _eq8_greedy, modes=[PolicyMode.CURTAILMENT])
register_policy("combined", _carbon_greedy, modes=[PolicyMode.CURTAILMENT])
