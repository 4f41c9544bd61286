"""What a round of the standard study costs the grid: energy, emissions and electricity bill.

Energy. A selected site at power fraction P_i does the round's work tau (the time it takes at full
power) in T_i = tau / P_i seconds, drawing its capped share P_i * train_kw, then waits for the
round to end (its upload, the straggler) at idle_kw. Over a round of length D:

    E_i = train_kw * tau + idle_kw * max(D - T_i, 0)                               (kJ, / 3600: kWh)

A capped site computes longer at a lower draw, so the training term is the same for every site;
what a policy changes is how many sites train and how long they wait. With ``round_power =
integrated`` T_i follows the site's changing power (``powertrip.forecast.compute_times_s``).
train_kw and idle_kw default to the curtailment study's node (4 x A100: 2.024 / 0.468 kW).

Grid. The standard study's sites carry no grid of their own, so site i sits in region ``i mod R``
of a synthetic grid (``SiteGrid``): carbon intensity from the embedded synthetic carbon trace (the
same one EcoLearn ranks by) and a synthetic wholesale price with an evening peak. Emissions and
cost multiply E_i by the site's intensity and price at the round's start. Both series are
labelled stand-ins (docs/joint-objective.md), deterministic in the grid seed.

Centralized baselines (one co-located site, no grid) get no footprint.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from powertrip.curtailment.emissions import IDLE_KW, TRAIN_KW
from powertrip.forecast import compute_times_s
from powertrip.rounds import RoundRecord
from powertrip.sites import PowerSource
from powertrip.traces.carbon import synthetic_carbon_trace
from powertrip.traces.io import ar1

__all__ = ["Footprint", "FootprintModel", "FootprintSettings", "SiteGrid", "synthetic_price"]

GRID_REGIONS = 5
GRID_HOURS = 72.0  # synthetic series length; the last sample holds after it


def synthetic_price(
    regions: int, hours: float = GRID_HOURS, step_s: float = 300.0, seed: int = 0
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(sample times s, price $/MWh of shape (regions, samples)): a per-region base level spread
    over 40-140 $/MWh in an order unrelated to the carbon trace's (cheap is not always clean), an
    evening peak of random height and phase, and AR(1) noise. Deterministic in ``seed``."""
    rng = np.random.default_rng([seed, 0x5052])
    steps = max(int(round(hours * 3600.0 / step_s)), 1)
    t = np.arange(steps) * step_s
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


@dataclass(frozen=True)
class Footprint:
    """Energy (kWh), emissions (kg CO2) and electricity cost ($) of some rounds."""

    energy_kwh: float = 0.0
    emissions_kg: float = 0.0
    cost_usd: float = 0.0

    def __add__(self, other: Footprint) -> Footprint:
        return Footprint(
            self.energy_kwh + other.energy_kwh,
            self.emissions_kg + other.emissions_kg,
            self.cost_usd + other.cost_usd,
        )


@dataclass(frozen=True)
class FootprintModel:
    """Prices a run's rounds from its records: the power each site had when its round started
    (or over the round, ``integrated``) and the grid it sits on."""

    power: PowerSource
    ideal_compute_s: float
    grid: SiteGrid
    train_kw: float = TRAIN_KW
    idle_kw: float = IDLE_KW
    integrated: bool = False

    def site_energy_kwh(self, record: RoundRecord) -> NDArray[np.float64]:
        """E_i of each selected site, in the order of ``record.selected``."""
        sites = np.asarray(record.selected, dtype=np.int64)
        started = record.time_s - record.duration_s
        tau = self.ideal_compute_s
        if self.integrated:
            compute = compute_times_s(self.power, started, tau, sites)
        else:
            compute = tau / np.maximum(np.asarray(self.power.power_at(started))[sites], 1e-12)
        idle_s = np.maximum(record.duration_s - compute, 0.0)
        return (self.train_kw * tau + self.idle_kw * idle_s) / 3600.0

    def per_site(
        self, record: RoundRecord
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """(kWh, kg CO2, $) of each selected site, in the order of ``record.selected``."""
        if not record.selected:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        energy = self.site_energy_kwh(record)
        started = record.time_s - record.duration_s
        sites = np.asarray(record.selected, dtype=np.int64)
        intensity = self.grid.intensity_of(sites, started)  # gCO2/kWh
        price = self.grid.price_of(sites, started)  # $/MWh
        return energy, energy * intensity / 1000.0, energy * price / 1000.0

    def round(self, record: RoundRecord) -> Footprint:
        energy, emissions, cost = self.per_site(record)
        return Footprint(float(energy.sum()), float(emissions.sum()), float(cost.sum()))

    def rounds(self, records: Iterable[RoundRecord]) -> Footprint:
        total = Footprint()
        for record in records:
            total = total + self.round(record)
        return total


class FootprintSettings(BaseModel):
    """The grid and node power a study prices its rounds on, and the joint policy's weights
    (``ExperimentConfig`` inherits them); left out of dumps while at their defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    train_kw: float = Field(
        TRAIN_KW, gt=0, exclude_if=lambda v: v == TRAIN_KW,
        description="Power of a site training at full power (kW); a capped site draws its share.",
    )  # fmt: skip
    idle_kw: float = Field(
        IDLE_KW, ge=0, exclude_if=lambda v: v == IDLE_KW,
        description="Power of a selected site waiting for its round to end (kW).",
    )  # fmt: skip
    grid_regions: int = Field(
        GRID_REGIONS, ge=1, exclude_if=lambda v: v == GRID_REGIONS,
        description="Synthetic grid regions (site i in region i mod R) for emissions and cost.",
    )  # fmt: skip
    grid_seed: int = Field(
        0, exclude_if=lambda v: v == 0, description="Seed of the synthetic carbon and price series."
    )
    carbon_weight: float = Field(
        0.5, ge=0, allow_inf_nan=False, exclude_if=lambda v: v == 0.5,
        description="powertrip-joint: weight of emissions against round time (0: ignore carbon).",
    )  # fmt: skip
    price_weight: float = Field(
        0.5, ge=0, allow_inf_nan=False, exclude_if=lambda v: v == 0.5,
        description="powertrip-joint: weight of electricity cost against round time (0: ignore).",
    )  # fmt: skip

    def site_grid(self) -> SiteGrid:
        return SiteGrid(self.grid_regions, self.grid_seed)
