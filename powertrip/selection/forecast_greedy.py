"""Forecast-aware PowerTrip: Algorithm 1 ranking and timing sites by the power they will have.

Each round the policy asks the context's forecast (``RoundContext.forecast``) for every site's
mean power over the round it is about to run, its own estimate of the round's length being the
horizon, and runs PowerTrip's Algorithm 1 on that profile instead of the current one: a site whose
power is about to drop ranks lower, one whose power is about to rise higher. Without a forecast
it is PowerTrip itself.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from powertrip.selection.base import RoundContext
from powertrip.selection.greedy import PROJECT_GREEDY, PowerTripGreedy, configured
from powertrip.selection.registration import register_policy
from powertrip.sites.profiles import UNAVAILABLE_POWER


class ForecastGreedy(PowerTripGreedy):
    """PowerTrip over forecast mean power; ``refine`` re-estimates the horizon that many times
    with the forecast profile (0: the horizon from the current power only)."""

    refine: int = 1

    def horizon_s(self, ctx: RoundContext) -> float:
        """The policy's own estimate of the round: T_hat(k) of its current count's top sites."""
        n = ctx.profile.size
        k = min(max(self.k or self.config.scaled(n)[0], self.config.min_sites), n)
        return float(self.prefix_times(ctx, self._top(ctx, k))[-1])

    def forecast_context(self, ctx: RoundContext) -> RoundContext:
        """``ctx`` with each site's power replaced by its forecast mean over the round."""
        assert ctx.forecast is not None
        view = ctx
        for _ in range(1 + self.refine):
            power = forecast_power(ctx, self.horizon_s(view))
            view = replace(ctx, profile=replace(ctx.profile, power=power))
        return view

    def select(self, ctx: RoundContext) -> NDArray[np.int64]:
        if ctx.forecast is None:
            return super().select(ctx)
        return super().select(self.forecast_context(ctx))


def forecast_power(ctx: RoundContext, horizon_s: float) -> NDArray[np.float64]:
    """The forecast mean power over [now, now + horizon], with the profile's unavailable sites
    kept at ``UNAVAILABLE_POWER`` (ranked last, as ``SiteProfile.for_ranking`` does)."""
    assert ctx.forecast is not None
    power = np.asarray(ctx.forecast.mean_power(ctx.now_s, horizon_s), dtype=np.float64)
    if ctx.profile.available is not None:
        power = np.where(ctx.profile.available, power, UNAVAILABLE_POWER)
    return np.maximum(power, UNAVAILABLE_POWER)


# The project's default over the forecast mean power of the round (docs/forecasts.md).
register_policy(
    "powertrip-forecast",
    lambda name, context: ForecastGreedy(configured(PROJECT_GREEDY, context), name=name),
)
