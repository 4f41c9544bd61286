"""What each site's worker reports with its update for the selection policy: the site's mean
local training loss (``UpdateHeader.train_loss``) and the samples it trained on
(``num_samples``, also the update's FedAvg weight). The executor passes them into the round's
``RoundOutcome`` as ``site_loss`` / ``site_samples``, aligned with ``selected`` as the emulator's
(``powertrip.emulate``), so Oort's statistical utility and the baselines built on it see over
the services what they see in the emulator (docs/selectors.md, "Over the services").

Both numbers are a peer's claim: a loss must be finite and >= 0, a sample count an integer in
[1, the site's shard as the aggregator assigned it]. A bad value is dropped with a warning naming
the site and the field; the update itself is still folded (its weight was already checked,
``RoundGate.weight_problem``; the loss plays no part in the fold). A site with no valid value, or
whose update did not arrive, is NaN in the arrays (float64's "not measured").
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from powertrip.rounds import RoundOutcome
from powertrip.sites import site_id

logger = logging.getLogger(__name__)


def loss_problem(loss: float) -> str | None:
    """Why ``loss`` is not a usable training loss (non-finite, negative), or None."""
    if not math.isfinite(loss) or loss < 0:
        return f"must be finite and >= 0, got {loss!r}"
    return None


def samples_problem(samples: float, most: float | None) -> str | None:
    """Why ``samples`` is not a sample count of a site assigned ``most`` samples, or None."""
    if not math.isfinite(samples) or samples != int(samples):
        return f"must be an integer, got {samples!r}"
    if samples < 1 or (most is not None and samples > most):
        top = "its shard" if most is None else f"{most:g}, the shard assigned to it"
        return f"must be at least 1 and at most {top}, got {samples:g}"
    return None


class SiteReports:
    """The open round's reports, per site; the executor takes them when the round ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._round: int | None = None
        self._loss: dict[int, float] = {}
        self._samples: dict[int, float] = {}

    def note(self, round_index: int, site: int, head: Any, most: float | None) -> None:
        """Keep what ``site``'s admitted update header ``head`` reports for ``round_index``
        (``most``: the samples the round assigned the site, None if unknown). Noted before the
        update's bytes are read, so the executor finds it once the update is folded; ``take``
        keeps only folded sites', and a resent update's header replaces the first one's."""
        loss = head.train_loss if head.HasField("train_loss") else None
        bad_loss = None if loss is None else loss_problem(loss)
        bad_samples = samples_problem(head.num_samples, most)
        for field, problem in (("train_loss", bad_loss), ("num_samples", bad_samples)):
            if problem is not None:
                logger.warning(
                    "round %d: %s reported %s that %s; not passed to the policy",
                    round_index,
                    site_id(site),
                    field,
                    problem,
                )
        with self._lock:
            if self._round != round_index:  # a new round: the old one's reports are done
                self._round, self._loss, self._samples = round_index, {}, {}
            if loss is not None and bad_loss is None:
                self._loss[site] = float(loss)
            if bad_samples is None:
                self._samples[site] = float(head.num_samples)

    def take(self, round_index: int, selected: Sequence[int], accepted: Sequence[int]) -> tuple:
        """(site_loss, site_samples) of the round, float64 in the order of ``selected``: NaN for
        a site whose update was not folded or that reported no valid value; None for both when
        no folded site reported a loss (an executor that measures none: the policy's fallback)."""
        with self._lock:
            loss, samples = (self._loss, self._samples) if self._round == round_index else ({}, {})
            self._round, self._loss, self._samples = None, {}, {}
        folded = set(accepted)
        if not any(s in loss for s in folded):
            logger.debug("round %d: no site reported a training loss", round_index)
            return None, None
        nan = float("nan")
        site_loss = np.array([loss.get(s, nan) if s in folded else nan for s in selected])
        site_samples = np.array([samples.get(s, nan) if s in folded else nan for s in selected])
        logger.debug(
            "round %d: per-site training loss %s, samples %s, sites %s",
            round_index,
            site_loss.tolist(),
            site_samples.tolist(),
            [site_id(s) for s in selected],
        )
        return site_loss, site_samples


def with_site_reports(outcome: RoundOutcome, reports: SiteReports, collector: Any) -> RoundOutcome:
    """``outcome`` with the per-site losses and sample counts of ``collector``'s round."""
    loss, samples = reports.take(collector.round, collector.selected, collector.accepted)
    return replace(outcome, site_loss=loss, site_samples=samples)


def note_update(executor: Any, collector: Any, site: int, head: Any) -> None:
    """The servicer's hook, once ``head`` is admitted to ``collector``'s round: keep what it
    reports (an executor without ``reports``, curtailment mode's, skips it)."""
    reports = getattr(executor, "reports", None)
    if reports is not None:
        allowance: Mapping[int, float] | None = getattr(collector, "allowance", None)
        most = None if allowance is None else allowance.get(site)
        reports.note(collector.round, site, head, most)
