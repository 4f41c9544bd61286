"""What a round of the standard study costs the grid: energy, emissions and electricity bill.

Energy. A selected site at power fraction P_i does the round's work tau (the time it takes at full
power) in T_i = tau / P_i seconds, drawing its capped share P_i * train_kw, then waits for the
round to end (its upload, the straggler) at idle_kw. Over a round of length D:

    E_i = train_kw * tau + idle_kw * max(D - T_i, 0)                               (kJ, / 3600: kWh)

A capped site computes longer at a lower draw, so the training term is the same for every site;
what a policy changes is how many sites train and how long they wait. With ``round_power =
integrated`` T_i follows the site's changing power (``powertrip.sites.forecast.compute_times_s``).
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

from powertrip.config.footprint import IDLE_KW, TRAIN_KW, FootprintSettings
from powertrip.rounds.loop import RoundRecord
from powertrip.sites.forecast import compute_times_s
from powertrip.sites.grid import SiteGrid, synthetic_price
from powertrip.sites.profiles import PowerSource

__all__ = ["Footprint", "FootprintModel", "FootprintSettings", "SiteGrid", "synthetic_price"]


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
