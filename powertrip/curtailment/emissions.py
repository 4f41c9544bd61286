"""Energy and operational emissions of a run, the way the curtailment paper's (arXiv 2602.22760)
analysis notebook counts them: two power levels per site, the trace's marginal intensity linearly
interpolated onto a 60 s grid, and a left sum of P(t)·MCI(t)·Δt. Values are taken as gCO2/kWh,
as the notebook does (WattTime's own unit is lbs/MWh). The "curtailed-energy share" is the energy
drawn while the site's own MCI was below θ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from powertrip.config.carbon import THRESHOLD
from powertrip.config.footprint import IDLE_KW, TRAIN_KW
from powertrip.traces.carbon import CarbonTrace

GRID_S = 60.0

Intervals = list[tuple[float, float]]


@dataclass
class SitePowerLog:
    """When one site was powered and when it trained; training intervals lie inside ``on``."""

    site: str
    region: str
    train_kw: float = TRAIN_KW
    idle_kw: float = IDLE_KW
    on: Intervals = field(default_factory=list)
    training: Intervals = field(default_factory=list)

    def states(self, t: NDArray[np.float64]) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        """(training, idle) masks at the times t."""
        on = np.zeros(t.shape, dtype=bool)
        training = np.zeros(t.shape, dtype=bool)
        for a, b in self.on:
            on |= (t >= a) & (t < b)
        for a, b in self.training:
            training |= (t >= a) & (t < b)
        return training, on & ~training

    def power_kw(self, t: NDArray[np.float64]) -> NDArray[np.float64]:
        training, idle = self.states(t)
        return training * self.train_kw + idle * self.idle_kw

    @property
    def training_hours(self) -> float:
        return sum(b - a for a, b in self.training) / 3600.0

    @property
    def end_s(self) -> float:
        return max((b for _, b in self.on + self.training), default=0.0)


@dataclass(frozen=True)
class EnergyReport:
    energy_kwh: float
    train_kwh: float
    idle_kwh: float
    emissions_kg: float
    curtailed_share: float  # of energy, drawn while the site's MCI < θ (0 when no energy)
    training_site_hours: float
    time_s: NDArray[np.float64]  # the grid
    cumulative_kg: NDArray[np.float64]  # emissions up to the end of each grid step


def intensity_on_grid(trace: CarbonTrace, region: str, t: NDArray[np.float64]):
    """Linear interpolation between samples (the notebook's), held flat beyond the trace."""
    return np.interp(t, trace.time_s, trace.series(region))


def account(
    logs: Sequence[SitePowerLog],
    trace: CarbonTrace,
    threshold: float = THRESHOLD,
    grid_s: float = GRID_S,
) -> EnergyReport:
    if grid_s <= 0:
        raise ValueError(f"grid step must be > 0 s, got {grid_s}")
    end = max((log.end_s for log in logs), default=0.0)
    t = np.arange(0.0, end, grid_s)
    hours = grid_s / 3600.0
    per_step_g = np.zeros_like(t)
    train = idle = curtailed = 0.0
    for log in logs:
        training, idling = log.states(t)
        p = training * log.train_kw + idling * log.idle_kw
        mci = intensity_on_grid(trace, log.region, t)
        per_step_g += p * mci * hours
        train += float(training.sum()) * log.train_kw * hours
        idle += float(idling.sum()) * log.idle_kw * hours
        curtailed += float(p[mci < threshold].sum()) * hours
    energy = train + idle
    return EnergyReport(
        energy_kwh=energy,
        train_kwh=train,
        idle_kwh=idle,
        emissions_kg=float(per_step_g.sum()) / 1000.0,
        curtailed_share=curtailed / energy if energy > 0 else 0.0,
        training_site_hours=sum(log.training_hours for log in logs),
        time_s=t + grid_s,
        cumulative_kg=np.cumsum(per_step_g) / 1000.0,
    )
