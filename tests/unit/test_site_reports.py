"""Each site's reported training loss and sample count reach the round's outcome in selection
order; hostile values are dropped with a log naming the site and the field."""

from __future__ import annotations

import logging
import math

import numpy as np

from powertrip.rounds import RoundOutcome, round_feedback
from powertrip.services.aggregator.site_reports import SiteReports, with_site_reports
from powertrip.v1 import aggregator_pb2


def head(site: str, samples: float, loss: float | None) -> aggregator_pb2.UpdateHeader:
    return aggregator_pb2.UpdateHeader(site_id=site, round=3, num_samples=samples, train_loss=loss)


class Collector:  # what with_site_reports reads of a RoundCollector
    def __init__(self, selected, accepted):
        self.round, self.selected, self.accepted = 3, selected, accepted


def test_reports_are_aligned_with_the_selection_and_missing_sites_are_nan():
    r = SiteReports()
    r.note(3, 7, head("site-007", 250, 0.5), most=250)
    r.note(3, 2, head("site-002", 100, 2.0), most=120)
    r.note(3, 5, head("site-005", 90, 1.0), most=90)  # noted, but its update never folded
    outcome = RoundOutcome(0.5, 1.0, (0.0, 0.0, 0.0), 2)
    out = with_site_reports(outcome, r, Collector([2, 5, 7, 9], accepted=[2, 7]))
    assert out.site_loss.tolist()[::2] == [2.0, 0.5]
    assert out.site_samples.tolist()[::2] == [100.0, 250.0]
    assert all(math.isnan(v) for v in [*out.site_loss[1::2], *out.site_samples[1::2]])
    fb = round_feedback(3, np.array([2, 5, 7, 9]), 60.0, out, 0.4, 1.2)
    assert fb.site_loss is out.site_loss and fb.site_samples is out.site_samples
    # taken once: the next round starts empty, and no loss at all leaves the policy's fallback
    assert with_site_reports(outcome, r, Collector([2], [2])).site_loss is None


def test_hostile_values_are_dropped_with_a_log_naming_site_and_field(caplog):
    r = SiteReports()
    with caplog.at_level(logging.WARNING):
        r.note(3, 1, head("site-001", 10, float("nan")), most=10)
        r.note(3, 2, head("site-002", 10, -0.1), most=10)
        r.note(3, 3, head("site-003", 10.5, 1.0), most=20)
        r.note(3, 4, head("site-004", 11, 1.0), most=10)
        r.note(3, 5, head("site-005", 0, float("inf")), most=10)
        r.note(3, 6, head("site-006", 10, None), most=10)  # not measured: no complaint
    logs = [rec.getMessage() for rec in caplog.records]
    for site, field in [(1, "train_loss"), (2, "train_loss"), (3, "num_samples")]:
        assert any(f"site-00{site} reported {field}" in m for m in logs), logs
    assert any("site-004 reported num_samples" in m and "at most 10" in m for m in logs)
    assert sum("site-005" in m for m in logs) == 2 and not any("site-006" in m for m in logs)
    loss, samples = r.take(3, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6])
    assert np.isnan(loss).tolist() == [True, True, False, False, True, True]
    assert np.isnan(samples).tolist() == [False, False, True, True, True, False]
