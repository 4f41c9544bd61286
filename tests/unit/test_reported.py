"""Every number a peer reports is bounded before a policy sees it (powertrip.rounds.reported,
reliability
R36): a training loss outside [0, 3x the evaluated loss], or none, counts as the round's median,
so the site that claimed it gains no selection under Oort, EcoLearn or FedZero.

Before this rule (b97b2b6), in this simulation the claiming site was picked in 52 to 59 of 60
rounds under Oort and EcoLearn (its twin: 7 to 10) for every claim: 1e300 topped the utility,
while 1.7e308 (its utility overflowed), a negative loss and NaN (both dropped) left the site
unexplored, so explored every round; FedZero picked it 57 times, or with 1e300 gave its MILP
utilities it cannot order (the twin 56 rounds, six sites none)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from powertrip.rounds.loop import RoundOutcome, policy_rng, round_feedback
from powertrip.rounds.reported import (
    LOSS_CEILING_FACTOR,
    bound_losses,
    bound_samples,
    loss_ceiling,
    samples_problem,
)
from powertrip.selection.base import RoundContext, SelectionPolicy
from powertrip.selection.ecolearn import EcoLearn
from powertrip.selection.fedzero import FedZero
from powertrip.selection.oort import Oort
from powertrip.services.aggregator.site_reports import SiteReports, with_site_reports
from powertrip.sites.profiles import SiteProfile
from powertrip.v1 import aggregator_pb2

NAN = math.nan


# -- the rule ------------------------------------------------------------------------------------
def test_a_loss_in_range_passes_and_any_other_counts_as_the_median_of_those_in_range():
    got = bound_losses([1.0, 3.0, 1e300, -1.0, math.inf, 2.0], reference=1.5)
    assert got.values is not None
    assert got.values.tolist() == [1.0, 3.0, 2.0, 2.0, 2.0, 2.0]  # median of 1, 3, 2
    assert [(i, r.reason) for i, r in got.refused] == [
        (2, "above_ceiling"),
        (3, "negative"),
        (4, "not_finite"),
    ]
    assert loss_ceiling(1.5) == LOSS_CEILING_FACTOR * 1.5 == 4.5
    assert bound_losses([4.5, 4.5000001], 1.5).refused[0][0] == 1  # the ceiling is the most


def test_nan_is_not_measured_unless_the_site_trained_and_the_rule_is_idempotent():
    untrained = bound_losses([NAN, 1.0], reference=1.0)
    assert math.isnan(untrained.values[0]) and untrained.refused == ()
    # an update that was folded with NaN or no loss at all: refused; a value of a site whose
    # update never folded is dropped
    got = bound_losses([NAN, None, 0.5, 7.0], reference=1.0, trained=[True, True, True, False])
    assert got.values[:3].tolist() == [0.5, 0.5, 0.5] and math.isnan(got.values[3])
    assert [r.reason for _, r in got.refused] == ["not_finite", "missing"]
    again = bound_losses(got.values, reference=1.0)
    np.testing.assert_array_equal(again.values, got.values)
    assert again.refused == ()


def test_without_a_peer_in_range_a_refused_claim_is_credited_nothing():
    # alone in its round: the evaluated loss would favour it (honest losses mostly lie below)
    assert bound_losses([1e300], reference=0.8).values.tolist() == [0.0]
    assert bound_losses([NAN, None], 0.8, trained=[True, True]).values.tolist() == [0.0, 0.0]
    # no usable reference: nothing to bound by but the domain
    assert bound_losses([1e300, -1.0], reference=NAN).values.tolist() == [1e300, 1e300]
    assert bound_losses([-1.0], reference=None).values.tolist() == [0.0]
    assert bound_losses(None, reference=1.0).values is None


def test_a_sample_count_is_a_whole_number_within_the_assigned_shard():
    assert samples_problem(100, 100) is None
    assert samples_problem(101, 100).reason == "out_of_range"
    assert samples_problem(10.5, 100).reason == "not_integer"
    assert samples_problem(NAN, 100).reason == "not_finite"
    assert [bound_samples(v, 100) for v in (100, 10.5, 1e300, 0.2, NAN)] == [100, 10, 100, 1, 1]


# -- no selection advantage, per policy -----------------------------------------------------------
SITES, HOSTILE, TWIN = 10, 5, 0  # the twin shares EcoLearn's carbon region (i mod 5) and wins ties
ROUNDS, SAMPLES = 60, 100.0


def header(site: int, loss: float) -> aggregator_pb2.UpdateHeader:
    return aggregator_pb2.UpdateHeader(
        site_id=f"site-{site:03d}", num_samples=SAMPLES, train_loss=loss
    )


class Collector:  # what with_site_reports reads of the aggregator's RoundCollector
    def __init__(self, round_index: int, selected: list[int]) -> None:
        self.round, self.selected, self.accepted = round_index, selected, selected


def selections(policy: SelectionPolicy, claim: float | None) -> np.ndarray:
    """How often each site is picked over ``ROUNDS`` rounds of identical sites whose honest
    losses fall as the model trains, when ``HOSTILE`` reports ``claim`` (None: honestly). Each
    round goes the way of a worker's report over the services: the update header, the
    aggregator's intake (``SiteReports``), then the round loop's feedback to the policy."""
    profile = SiteProfile(np.ones(SITES), np.full(SITES, 5.0), np.full(SITES, 100.0))
    rng, noise = policy_rng(0, policy), np.random.default_rng(1)
    reports, counts, previous = SiteReports(), np.zeros(SITES, dtype=int), 2.3
    for r in range(1, ROUNDS + 1):
        ctx = RoundContext(r, 60.0 * r, profile, 30.0, 1e6, rng)
        selected = np.asarray(policy.select(ctx), dtype=np.int64)
        counts[selected] += 1
        evaluated = 2.3 * 0.97**r  # the global model's loss after this round
        for s in selected.tolist():
            honest = evaluated * (0.8 + 0.2 * noise.random())
            reports.note(r, s, header(s, honest if s != HOSTILE or claim is None else claim), 100)
        outcome = RoundOutcome(0.5, evaluated, (0.0, 0.0, 0.0), selected.size)
        outcome = with_site_reports(outcome, reports, Collector(r, selected.tolist()))
        policy.observe(round_feedback(r, selected, 60.0, outcome, 0.5, previous))
        previous = evaluated
    return counts


POLICIES = {"oort": Oort, "ecolearn": EcoLearn, "fedzero": FedZero}


@pytest.mark.reliability("R36")
@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("claim", [1e300, 1.7e308, -1.0, NAN])
def test_an_absurd_loss_gives_the_claiming_site_no_selection_advantage(name, claim):
    honest = selections(POLICIES[name](), None)
    hostile = selections(POLICIES[name](), claim)
    # no more rounds than when it reports honestly, nor than its twin, give or take chance
    slack = 2 * math.sqrt(honest.mean())
    assert hostile[HOSTILE] <= honest[HOSTILE] + slack, (hostile.tolist(), honest.tolist())
    assert hostile[HOSTILE] <= hostile[TWIN] + slack, hostile.tolist()
    # and the honest sites share the rounds as before (no site starved or favoured)
    assert hostile.max() <= honest.max() + slack, (hostile.tolist(), honest.tolist())
