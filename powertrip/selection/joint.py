"""PowerTrip with a joint objective: accuracy gained per unit of time, emissions and electricity
cost together (``powertrip-joint``).

Algorithm 1 picks the count k with the best projected gain per second, Delta A(k) / T(k). Here
the denominator is a joint cost J(k) in which emissions and cost weigh against time:

    J(k) = T(k) / (1 + l_c + l_p) * [ T(k)/T(k_r) + l_c * G(k)/G(k_r) + l_p * $(k)/$(k_r) ]

with G(k) and $(k) the estimated emissions and electricity cost of a round on the first k
ranked sites (the footprint model of ``powertrip.footprint``: train_kw * tau per site plus
idle_kw while it waits for T(k)), k_r the current count, and l_c, l_p the carbon and price
weights. Each term is relative to the current round, so the weights are unitless, J(k_r) =
T(k_r), and l_c = l_p = 0 is PowerTrip itself. The sites are ranked by their own round time
(tau / P_i + C_i, the default's ranking) inflated by their grid:

    key_i = (tau / P_i + C_i) * (1 + l_c * I_i / mean I + l_p * p_i / mean p)

where I_i and p_i are the site's carbon intensity and price now (``SiteGrid``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from powertrip.config.footprint import FootprintSettings
from powertrip.selection.base import RoundContext
from powertrip.selection.greedy import PROJECT_GREEDY, GreedyConfig, PowerTripGreedy, configured
from powertrip.selection.registration import register_policy
from powertrip.selection.topk import top_order
from powertrip.sites.grid import SiteGrid


class JointGreedy(PowerTripGreedy):
    """Algorithm 1 over a grid-inflated ranking and the joint cost J(k) instead of T(k)."""

    def __init__(
        self,
        config: GreedyConfig,
        settings: FootprintSettings | None = None,
        name: str = "powertrip-joint",
    ) -> None:
        super().__init__(config, name=name)
        self.settings = settings or FootprintSettings()
        self.grid: SiteGrid = SiteGrid.from_settings(self.settings)

    def _grid(self, ctx: RoundContext) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        n = ctx.profile.size
        return self.grid.intensity(n, ctx.now_s), self.grid.price(n, ctx.now_s)

    def _top(self, ctx: RoundContext, m: int) -> NDArray[np.int64]:
        s = self.settings
        intensity, price = self._grid(ctx)
        inflate = 1.0 + s.carbon_weight * intensity / intensity.mean()
        inflate += s.price_weight * price / price.mean()
        own = ctx.ideal_compute_s / ctx.profile.power + ctx.profile.comm_s
        return top_order(own * inflate, m)

    def prefix_times(self, ctx: RoundContext, order: NDArray[np.int64]) -> NDArray[np.float64]:
        times = super().prefix_times(ctx, order)
        s = self.settings
        if s.carbon_weight == 0 and s.price_weight == 0:
            return times
        intensity, price = self._grid(ctx)
        tau = ctx.ideal_compute_s
        compute = tau / ctx.profile.power[order]
        k_r = min(max(self.k or 1, 1), times.size) - 1

        def cost(weight: NDArray[np.float64]) -> NDArray[np.float64]:
            """Estimated sum_i E_i * weight_i over each prefix (kJ times the weight's unit)."""
            w = weight[order]
            waiting = np.maximum(times * np.cumsum(w) - np.cumsum(compute * w), 0.0)
            return s.train_kw * tau * np.cumsum(w) + s.idle_kw * waiting

        joint = times / times[k_r]
        for weight, series in ((s.carbon_weight, intensity), (s.price_weight, price)):
            if weight:
                c = cost(series)
                joint = joint + weight * c / max(c[k_r], 1e-12)
        return joint * times[k_r] / (1.0 + s.carbon_weight + s.price_weight)


# The default weighs emissions and electricity cost against time on the study's grid
# (``FootprintSettings``). Trading time for footprint runs few sites, so it keeps to the run's
# round budget (3 decisions in a row behind the target's pace grow k; docs/joint-objective.md).
JOINT_GREEDY = replace(PROJECT_GREEDY, round_budget=3)
register_policy(
    "powertrip-joint",
    lambda name, context: JointGreedy(
        configured(JOINT_GREEDY, context), context.footprint, name=name
    ),
)
