"""Weight inflation (reliability R26): an authenticated worker's sample count is a claim, and the
aggregator bounds it by what it assigned the site this round.

On main before this fix, one update claiming ``num_samples=1e12`` moved every parameter of the
global model by that worker's delta, and ``1e300`` overflowed ``FedAvg.dispersion`` and failed
the run (again after every restart). Here a real AggregatorService on a real socket refuses each
such claim at the update's header, counts it, and the round commits the honest updates only.
"""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import REGISTRY

from powertrip.aggregation.robust import Aggregation
from powertrip.rounds.outcome import round_outcome
from tests.integration import test_aggregator_servicer as servicer_tests
from tests.integration.test_aggregator_servicer import C, code_of, delta, register, submit

# the servicer tests' real AggregatorRun and server, shared rather than built twice
run, stub = servicer_tests.run, servicer_tests.stub

ROUND = 3
SUBNORMAL = 5e-324


def refused_weights() -> float:
    return REGISTRY.get_sample_value("powertrip_updates_total", {"outcome": "bad_weight"}) or 0.0


def honest(run, site: int) -> float:
    """The weight the run assigned ``site``: its partition's sample count."""
    return float(run.executor.site_weights[site])


@pytest.fixture
def open_round(stub, run):
    s, _ = stub
    register(s, "w-a", ["site-000", "site-001"])
    register(s, "w-b", ["site-002"])
    collector = run.executor.open_round(ROUND, [0, 1, 2])
    yield s, collector
    collector.close()
    run.executor.collector = None


@pytest.mark.reliability("R26", "R11")
@pytest.mark.parametrize(
    ("claim", "words"),
    [
        (1e300, "above the largest count"),
        (1e12, "assigned"),
        (0.0, "> 0"),
        (-5.0, "> 0"),
        (SUBNORMAL, "subnormal"),
        (float("nan"), "finite"),
        (0.5, "at least 1"),
    ],
)
def test_an_inflated_or_absurd_weight_is_refused_and_the_round_commits_the_honest_updates(
    open_round, run, claim, words
):
    s, collector = open_round
    before = refused_weights()
    got, details = code_of(lambda: submit(s, run, site=0, value=0.5, samples=claim))
    assert got == C.INVALID_ARGUMENT and words in details, details
    assert "site-000" in details
    assert refused_weights() == before + 1
    # the honest sites, each at exactly the weight it was assigned, still count
    assert submit(s, run, site=1, value=0.01, samples=honest(run, 1)).accepted
    assert submit(s, run, site=2, value=0.03, worker="w-b", samples=honest(run, 2)).accepted
    collector.close()
    assert collector.accepted == [1, 2] and collector.failed == {0: "bad_weight"}
    template = run.executor.params
    outcome = round_outcome(collector.agg, template, run._evaluate, selected=3)
    expected = Aggregation().make(template)  # the default rule, as the collector folds
    expected.add(delta(run, 0.01), honest(run, 1))
    expected.add(delta(run, 0.03), honest(run, 2))
    want = expected.apply(template)
    assert all(np.array_equal(outcome.params[k], want[k]) for k in template)
    assert all(np.isfinite(x) for x in outcome.dispersion)


@pytest.mark.reliability("R26")
def test_the_honest_maximum_is_accepted_and_one_sample_more_is_not(open_round, run):
    s, collector = open_round
    most = honest(run, 0)
    got, details = code_of(lambda: submit(s, run, site=0, samples=most + 1))
    assert got == C.INVALID_ARGUMENT and f"assigned it {most:g}" in details
    # refused at the header: the site may send its update again, honestly, in the same round
    assert submit(s, run, site=0, samples=most).accepted
    assert submit(s, run, site=1, samples=1.0).accepted  # less work than assigned: its claim
    collector.close()
    assert collector.accepted == [0, 1]
    assert collector.agg.total_weight == most + 1.0
