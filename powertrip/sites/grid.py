"""The synthetic grid each site draws from: its region's carbon intensity and electricity price
over time. Cheap and clean regions do not coincide, so a policy that weighs both has a real
trade-off to make."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from powertrip.config.footprint import GRID_REGIONS, FootprintSettings
from powertrip.traces.carbon import synthetic_carbon_trace
from powertrip.traces.io import ar1

GRID_HOURS = 72.0  # synthetic series length; the last sample holds after it


def synthetic_price(
    regions: int, hours: float = GRID_HOURS, step_s: float = 300.0, seed: int = 0
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(sample times s, price $/MWh of shape (regions, samples)): a per-region base level spread
    over 40-140 $/MWh in an order unrelated to the carbon trace's (cheap is not always clean), an
    evening peak of random height and phase, and AR(1) noise. Deterministic in ``seed``."""
    rng = np.random.default_rng([seed, 0x5052])
    steps = max(int(round(hours * 3600.0 / step_s)), 1)
    t = np.arange(steps, dtype=np.float64) * step_s
    bases = rng.permutation(np.linspace(40.0, 140.0, regions))
    out = np.empty((regions, steps))
    for r, base in enumerate(bases):
        peak = rng.uniform(0.3, 0.8)
        phase = rng.uniform(0.0, 2 * np.pi)
        daily = np.maximum(0.0, np.sin(2 * np.pi * t / 86_400.0 + phase)) ** 2
        noise = ar1(0.0, rng.normal(0.0, 0.05 * base, size=steps), 0.9)
        out[r] = np.maximum(base * (1.0 + peak * daily) + noise, 1.0)
    return t, out


class SiteGrid:
    """Site i's grid is region (i mod R): carbon intensity (gCO2/kWh) and price ($/MWh) at t."""

    @classmethod
    def from_settings(cls, settings: FootprintSettings) -> SiteGrid:
        """The grid a study's footprint settings describe."""
        return cls(settings.grid_regions, settings.grid_seed)

    def __init__(self, regions: int = GRID_REGIONS, seed: int = 0, hours: float = GRID_HOURS):
        if regions < 1:
            raise ValueError("the grid needs at least one region")
        names = tuple(f"region-{r}" for r in range(regions))
        self.carbon = synthetic_carbon_trace(names, hours=hours, seed=seed)
        self.price_time_s, self.prices = synthetic_price(regions, hours, seed=seed)

    def intensity(self, n: int, t_s: float) -> NDArray[np.float64]:
        """Sites 0..n-1's intensity at t."""
        return self.intensity_of(np.arange(n), t_s)

    def price(self, n: int, t_s: float) -> NDArray[np.float64]:
        """Sites 0..n-1's price at t."""
        return self.price_of(np.arange(n), t_s)

    def intensity_of(self, sites: NDArray[np.int64], t_s: float) -> NDArray[np.float64]:
        per_region = self.carbon.intensity_at(t_s)
        return per_region[sites % per_region.size].astype(np.float64)

    def price_of(self, sites: NDArray[np.int64], t_s: float) -> NDArray[np.float64]:
        i = max(int(np.searchsorted(self.price_time_s, t_s, side="right")) - 1, 0)
        per_region = self.prices[:, i]
        return per_region[sites % per_region.size]
