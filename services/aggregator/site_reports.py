"""What each site's worker reports with its update for the selection policy: the site's mean
local training loss (``UpdateHeader.train_loss``) and the samples it trained on
(``num_samples``, also the update's FedAvg weight). The executor passes them into the round's
``RoundOutcome`` as ``site_loss`` / ``site_samples``, aligned with ``selected`` as the emulator's
(``powertrip.rounds.emulate``), so Oort's statistical utility and the baselines built on it see over
the services what they see in the emulator (docs/selectors.md, "Over the services").

Both numbers are a peer's claim, bounded by ``powertrip.rounds.reported`` (the one rule, shared
with the
round loop) once the round's model is evaluated: a loss outside [0, 3x the evaluated loss], or
none, from a site whose update was folded counts as the round's median loss; a sample count
outside [1, the site's shard as the aggregator assigned it] is refused with the update
(``RoundGate.weight_problem``), and a fraction is rounded down. Each is logged naming the site
and the field, and counted in ``powertrip_reported_values_refused_total``. A site whose update
did not arrive is NaN in the arrays (float64's "not measured").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from powertrip.rounds.loop import RoundOutcome
from powertrip.rounds.reported import Refusal, bound_losses, bound_samples, samples_problem
from powertrip.services.aggregator import metrics
from powertrip.sites.profiles import site_id

logger = logging.getLogger(__name__)


def _refused(round_index: int, site: int, field: str, why: Refusal, then: str) -> None:
    """One line naming the site and the field, and the count by field and reason."""
    metrics.REPORTED_REFUSED.labels(field, why.reason).inc()
    # a host that measures no loss omits it every round: not worth a warning each time
    level = logging.DEBUG if why.reason == "missing" else logging.WARNING
    what = f"round {round_index}: {site_id(site)} reported {field} that {why.detail}; {then}"
    logger.log(level, "%s", what)


class SiteReports:
    """The open round's reports, per site; the executor takes them when the round ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._round: int | None = None
        self._loss: dict[int, float | None] = {}  # None: the header had no train_loss
        self._samples: dict[int, tuple[float, float | None]] = {}  # (claim, most assigned)

    def note(self, round_index: int, site: int, head: Any, most: float | None) -> None:
        """Keep what ``site``'s admitted update header ``head`` claims for ``round_index``
        (``most``: the samples the round assigned the site, None if unknown). Noted before the
        update's bytes are read, so the executor finds it once the update is folded; ``take``
        judges only folded sites', and a resent update's header replaces the first one's."""
        loss = head.train_loss if head.HasField("train_loss") else None
        with self._lock:
            if self._round != round_index:  # a new round: the old one's reports are done
                self._round, self._loss, self._samples = round_index, {}, {}
            self._loss[site] = None if loss is None else float(loss)
            self._samples[site] = (float(head.num_samples), most)

    def take(
        self,
        round_index: int,
        selected: Sequence[int],
        accepted: Sequence[int],
        reference: float | None = None,
    ) -> tuple:
        """(site_loss, site_samples) of the round, float64 in the order of ``selected``, bounded
        by ``powertrip.rounds.reported`` with ``reference`` (the loss of the round's evaluated
        model):
        NaN for a site whose update was not folded; None for both when no folded site reported
        a loss (an executor that measures none: the policy's fallback)."""
        with self._lock:
            loss, samples = (self._loss, self._samples) if self._round == round_index else ({}, {})
            self._round, self._loss, self._samples = None, {}, {}
        folded = set(accepted)
        if not any(loss.get(s) is not None for s in folded):
            logger.debug("round %d: no site reported a training loss", round_index)
            return None, None
        nan = float("nan")
        trained = [s in folded for s in selected]
        claimed = [loss.get(s) for s in selected]  # None: no claim
        bounded = bound_losses(claimed, reference, trained)
        then = "it counts as the median of the round's other losses (none: 0)"
        for i, why in bounded.refused:
            _refused(round_index, selected[i], "train_loss", why, then)
        site_samples = np.full(len(selected), nan)
        for i, s in enumerate(selected):
            if trained[i] and s in samples:
                claim, most = samples[s]
                site_samples[i] = bound_samples(claim, most)
                problem = samples_problem(claim, most)
                if problem is not None:  # folded: its weight passed, only a fraction is left
                    _refused(round_index, s, "num_samples", problem, f"{site_samples[i]:g} is used")
        assert bounded.values is not None
        logger.debug(
            "round %d: per-site training loss %s, samples %s, sites %s",
            round_index,
            bounded.values.tolist(),
            site_samples.tolist(),
            [site_id(s) for s in selected],
        )
        return bounded.values, site_samples


def with_site_reports(outcome: RoundOutcome, reports: SiteReports, collector: Any) -> RoundOutcome:
    """``outcome`` with the per-site losses and sample counts of ``collector``'s round, bounded
    by the loss ``outcome``'s model was evaluated at."""
    loss, samples = reports.take(
        collector.round, collector.selected, collector.accepted, outcome.loss
    )
    return replace(outcome, site_loss=loss, site_samples=samples)


def note_update(executor: Any, collector: Any, site: int, head: Any) -> None:
    """The servicer's hook, once ``head`` is admitted to ``collector``'s round: keep what it
    reports (an executor without ``reports``, curtailment mode's, skips it)."""
    reports = getattr(executor, "reports", None)
    if reports is not None:
        allowance: Mapping[int, float] | None = getattr(collector, "allowance", None)
        most = None if allowance is None else allowance.get(site)
        reports.note(collector.round, site, head, most)
