"""PowerTrip mode's footprint on ``/metrics`` (docs/joint-objective.md, "Where it shows").

Each completed round is priced as the library prices it (``powertrip.footprint.FootprintModel``:
the run's ``FootprintSettings``, its tau, ``round_power``), with the power the profiler reported
(``ObservedPower``) as the power source, and added per site to ``powertrip_energy_joules_total``,
``powertrip_emissions_grams_total`` and ``powertrip_electricity_cost_dollars_total``. Rounds a
restart replays from the journal were counted (and drawn) before the restart: they are skipped.
The counters only watch the run: a round that cannot be priced (no power reported yet) is logged
and left out, never failed.
"""

from __future__ import annotations

import logging

from powertrip.config.experiment import ExperimentConfig
from powertrip.footprint import FootprintModel
from powertrip.rounds.loop import RoundRecord
from powertrip.services.aggregator import metrics
from powertrip.sites.grid import SiteGrid
from powertrip.sites.profiles import PowerSource, site_id

__all__ = ["FootprintMeter"]

logger = logging.getLogger(__name__)


class FootprintMeter:
    """Adds each completed round's per-site footprint to the aggregator's counters."""

    def __init__(self, exp: ExperimentConfig, power: PowerSource, ideal_compute_s: float) -> None:
        """``ideal_compute_s``: the tau of the run's ``TimeModel`` (the wall-clock tau on a wall
        clock, where the records' times are wall seconds)."""
        self.model = FootprintModel(
            power,
            ideal_compute_s,
            SiteGrid.from_settings(exp),
            exp.train_kw,
            exp.idle_kw,
            integrated=exp.round_power == "integrated",
        )

    def count(self, record: RoundRecord) -> None:
        """Price ``record`` and add it to the counters (nothing for a failed round)."""
        if record.outcome != "completed" or not record.selected:
            return
        try:
            energy_kwh, emissions_kg, cost_usd = self.model.per_site(record)
        except Exception:  # noqa: BLE001 - the footprint watches the run; it never stops it
            logger.warning("round %d: footprint not counted", record.round, exc_info=True)
            return
        for s, kwh, kg, usd in zip(
            record.selected, energy_kwh, emissions_kg, cost_usd, strict=True
        ):
            site = site_id(int(s))
            metrics.ENERGY.labels(site).inc(float(kwh) * metrics.JOULES_PER_KWH)
            metrics.EMISSIONS.labels(site).inc(float(kg) * 1000.0)
            metrics.COST.labels(site).inc(float(usd))
