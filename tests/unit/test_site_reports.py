"""Each site's reported training loss and sample count reach the round's outcome in selection
order; a hostile value counts as the round's median loss (powertrip.rounds.reported), with a log
naming
the site and the field, and a count by field and reason."""

from __future__ import annotations

import logging
import math

import numpy as np
from prometheus_client import REGISTRY

from powertrip.rounds.loop import RoundOutcome, round_feedback
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
    np.testing.assert_array_equal(fb.site_loss, out.site_loss)  # in range: unchanged
    assert fb.site_samples is out.site_samples
    # taken once: the next round starts empty, and no loss at all leaves the policy's fallback
    assert with_site_reports(outcome, r, Collector([2], [2])).site_loss is None


def refused(field: str, reason: str) -> float:
    labels = {"field": field, "reason": reason}
    return REGISTRY.get_sample_value("powertrip_reported_values_refused_total", labels) or 0.0


def test_hostile_values_count_as_the_rounds_median_with_a_log_naming_site_and_field(caplog):
    r = SiteReports()
    r.note(3, 1, head("site-001", 10, float("nan")), most=10)
    r.note(3, 2, head("site-002", 10, -0.1), most=10)
    r.note(3, 3, head("site-003", 10.5, 1.0), most=20)  # a fraction: its weight passed the fold
    r.note(3, 4, head("site-004", 10, 2.0), most=10)
    r.note(3, 5, head("site-005", 10, float("inf")), most=10)
    r.note(3, 6, head("site-006", 10, None), most=10)  # not measured: counted, no warning
    r.note(3, 7, head("site-007", 10, 1e300), most=10)  # above 3x the evaluated loss
    r.note(3, 8, head("site-008", 10, 1.0), most=10)  # in range, but its update never folded
    reasons = ("not_finite", "negative", "above_ceiling", "missing")
    before = {k: refused("train_loss", k) for k in reasons}
    with caplog.at_level(logging.WARNING):
        loss, samples = r.take(3, [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7], reference=1.5)
    logs = [rec.getMessage() for rec in caplog.records]
    for site in (1, 2, 5, 7):
        assert any(f"site-00{site} reported train_loss" in m for m in logs), logs
    assert any("site-007" in m and "at most 4.5" in m for m in logs), logs
    assert any("site-003 reported num_samples" in m and "10 is used" in m for m in logs), logs
    assert not any("site-006" in m or "site-004" in m for m in logs)
    assert loss[:7].tolist() == [1.5, 1.5, 1.0, 2.0, 1.5, 1.5, 1.5]  # median of 1.0 and 2.0
    assert math.isnan(loss[7]) and math.isnan(samples[7])
    assert samples[:7].tolist() == [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0]
    counted = {k: refused("train_loss", k) - before[k] for k in reasons}
    assert counted == {"not_finite": 2, "negative": 1, "above_ceiling": 1, "missing": 1}
