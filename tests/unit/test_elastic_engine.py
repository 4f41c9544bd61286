"""Elastic rounds (the curtailment paper's prototype): pause, solo and federated modes; joins wait
for the next round; a departing site finishes its current step and its partial work is aggregated,
weighted by batches; one data cursor so no sample is repeated or lost. The learner here only records
what it was asked to train, so every number below is exact."""

from __future__ import annotations

import math

import numpy as np
import pytest

from powertrip.curtailment.availability import Episode, SiteAvailability
from powertrip.curtailment.cursor import ShardCursor
from powertrip.curtailment.emissions import account
from powertrip.curtailment.engine import ElasticEngine
from powertrip.curtailment.run_model import ElasticSite, LearnOutcome
from powertrip.curtailment.wall_clock import WallClockRounds
from powertrip.selection.base import SelectAll

STEP_S = 60.0  # one optimizer step at full power
OVERHEAD_S = 40.0
BATCH = 10
ROUNDS = WallClockRounds(step_s=STEP_S, round_min_s=600.0, overhead_s=OVERHEAD_S)


class RecordingLearner:
    """Keeps (site, steps, rows) of every contribution; accuracy = fraction of data seen."""

    def __init__(self, total_rows: int) -> None:
        self.total = total_rows
        self.seen = 0
        self.rounds: list[list[tuple[int, int, np.ndarray]]] = []

    def evaluate(self) -> tuple[float, float]:
        return self.seen / self.total, 1.0

    def train_round(self, work, checkpoints) -> LearnOutcome:  # noqa: ANN001
        done = [(w.site, w.steps, w.rows.copy()) for w in work if w.steps > 0]
        self.rounds.append(done)
        self.seen += sum(len(r) for _, _, r in done)
        cps = () if checkpoints is None else tuple((0.0, 1.0) for _ in checkpoints.steps)
        return LearnOutcome(self.seen / self.total, 1.0, (1.0, 1.0, 1.0), cps)


def site(name: str, *episodes: tuple[float, float, float]) -> SiteAvailability:
    return SiteAvailability(name, "r", tuple(Episode(*e) for e in episodes))


def play(avail: list[SiteAvailability], total_rows: int, shards: int = 8, horizon=math.inf):
    sites = [ElasticSite(a.site, "r") for a in avail]
    engine = ElasticEngine(sites, avail, ROUNDS, BATCH, horizon)
    learner = RecordingLearner(total_rows)
    run = engine.run(SelectAll(), learner, ShardCursor(total_rows, shards))
    return run, learner


def work_of(run, round_index: int) -> dict[str, tuple[int, int, float, bool]]:
    """site -> (steps, rows, finish time, left) in one round."""
    r = run.rounds[round_index - 1]
    return {run.sites[w.site].name: (w.steps, len(w.rows), w.finish_s, w.left) for w in r.work}


def test_a_site_leaving_mid_round_finishes_its_step_and_its_partial_work_is_aggregated():
    # a: always there; b: leaves at 1000 s; c: joins at 2000 s and ends a's solo stretch.
    avail = [site("a", (0, 0, math.inf)), site("b", (0, 0, 1000)), site("c", (0, 2000, math.inf))]

    run, learner = play(avail, total_rows=1_000)

    # Round 1 (0-640): both train 600 s = 10 steps of 60 s.
    assert work_of(run, 1) == {"a": (10, 100, 640.0, False), "b": (10, 100, 640.0, False)}
    # Round 2 starts at 640, training at 680. b is told to stop at 1000, 5.33 steps in: it
    # finishes step 6 (at 1040) and leaves. From 1280 a is the only connected site and trains on
    # alone, unsynchronised, until c connects at 2000: 22 steps.
    assert work_of(run, 2) == {"a": (22, 220, 2000.0, False), "b": (6, 60, 1040.0, True)}
    assert run.rounds[1].end_s == 2000.0
    # Both updates of round 2 reached the aggregation, weighted by their batches.
    assert [(s, k) for s, k, _ in learner.rounds[1]] == [(0, 22), (1, 6)]
    # b's last step ran past its window: it drew training power until the step was done.
    assert run.power_logs[1].training[-1] == (680.0, 1040.0)
    assert run.power_logs[1].on == [(0.0, 1000.0)]
    # c joined mid-round 2 and starts with the next round.
    assert work_of(run, 3).keys() == {"a", "c"} and run.rounds[2].start_s == 2000.0


def test_a_site_joining_mid_round_waits_for_the_next_round_and_idles_meanwhile():
    # b is provisioned at 60 s and ready at 300 s, 260 s into a's round.
    avail = [site("a", (0, 0, math.inf)), site("b", (60, 300, math.inf))]

    run, _ = play(avail, total_rows=400)

    # a was alone when round 1 began; at its 600 s minimum two sites are connected: stop.
    assert work_of(run, 1) == {"a": (10, 100, 640.0, False)}
    assert work_of(run, 2).keys() == {"a", "b"}
    # b drew idle power from provisioning (60 s) until it began training (680 s).
    b = run.power_logs[1]
    assert b.on[0][0] == 60.0 and b.training[0][0] == 680.0
    energy = account([b], _flat_trace(), grid_s=1.0)
    later_loads = sum(r.train_start_s - r.start_s for r in run.rounds[2:])
    idle_s = (680.0 - 60.0) + later_loads
    assert energy.idle_kwh == pytest.approx(idle_s / 3600 * b.idle_kw, rel=1e-6)


def test_a_lone_site_trains_on_past_the_minimum_until_membership_changes():
    avail = [site("a", (0, 0, math.inf)), site("b", (0, 5_000, math.inf))]

    run, _ = play(avail, total_rows=2_000)

    # No sync at 640 s: a trains alone until b connects at 5000 s, then finishes its step.
    assert work_of(run, 1) == {"a": (83, 830, 5020.0, False)}
    modes = run.mode_segments()
    assert modes[0] == (0.0, 5020.0, "solo") and modes[1][2] == "federated"


def test_no_site_pauses_the_clock_until_the_next_site_is_ready():
    avail = [site("a", (0, 0, 1_000)), site("b", (2_500, 3_000, math.inf))]

    run, _ = play(avail, total_rows=500)

    # a is told to stop at 1000 s, exactly at the end of its 16th step.
    assert work_of(run, 1) == {"a": (16, 160, 1000.0, True)}
    assert run.pauses == [(1000.0, 3000.0)]
    assert run.rounds[1].start_s == 3000.0
    assert [m for *_, m in run.mode_segments()] == ["solo", "pause", "solo"]


def test_a_site_leaving_during_the_load_overhead_contributes_nothing_and_loses_no_data():
    avail = [site("a", (0, 0, 20)), site("b", (0, 0, math.inf))]

    run, learner = play(avail, total_rows=300, shards=6)

    assert work_of(run, 1)["a"] == (0, 0, 40.0, True)
    assert all(s == 1 for s, _, _ in learner.rounds[0])
    rows = np.concatenate([r for rnd in learner.rounds for _, _, r in rnd])
    assert np.array_equal(np.sort(rows), np.arange(300))


def test_work_accounting_is_exact_under_churn():
    # Four sites coming and going with random windows: every sample is trained exactly once,
    # every contribution's rows are its batches' worth, and the run ends when data runs out.
    rng = np.random.default_rng(7)
    avail = []
    for k in range(4):
        starts = np.sort(rng.uniform(0, 40_000, size=4))
        eps = [(s, s + 240, s + rng.uniform(200, 6_000)) for s in starts]
        merged = [eps[0]]
        for e in eps[1:]:  # keep episodes disjoint
            if e[0] >= merged[-1][2]:
                merged.append(e)
        avail.append(site(f"s{k}", *merged))
    avail.append(site("steady", (30_000, 30_000, math.inf)))  # guarantees the end is reached
    total = 7_777

    run, learner = play(avail, total_rows=total, shards=37)

    assert run.finished and run.rows_done == total
    rows = np.concatenate([r for rnd in learner.rounds for _, _, r in rnd])
    assert rows.size == total and np.array_equal(np.sort(rows), np.arange(total))
    for rnd in learner.rounds:
        for _, steps, r in rnd:
            assert math.ceil(r.size / BATCH) == steps
    assert sum(w.steps for r in run.rounds for w in r.work) == sum(
        k for rnd in learner.rounds for _, k, _ in rnd
    )
    assert any(w.left and w.steps > 0 for r in run.rounds for w in r.work)  # churn did happen
    assert run.end_s == run.rounds[-1].end_s


def test_a_slower_site_does_proportionally_fewer_steps_in_the_same_round():
    sites = [ElasticSite("fast", "r", power=1.0), ElasticSite("slow", "r", power=0.25)]
    avail = [site("fast", (0, 0, math.inf)), site("slow", (0, 0, math.inf))]
    engine = ElasticEngine(sites, avail, ROUNDS, BATCH)

    run = engine.run(SelectAll(), RecordingLearner(10_000), ShardCursor(10_000, 8))

    # 600 s: 10 steps of 60 s vs 3 steps of 240 s (the third ends at 720 s: a straggler).
    r1 = run.rounds[0]
    assert [(w.steps, w.finish_s) for w in r1.work] == [(10, 640.0), (3, 760.0)]
    assert r1.end_s == 760.0


def test_the_observation_period_ends_an_unfinished_run():
    avail = [site("a", (0, 0, 2_000))]

    run, _ = play(avail, total_rows=10_000, horizon=5_000)

    assert not run.finished and run.end_s == 5_000
    # a's last step began before its window closed and ends at 40 + 33 * 60 = 2020 s.
    assert run.mode_segments()[-1] == (2_020.0, 5_000.0, "pause")


def _flat_trace():
    from datetime import UTC, datetime

    from powertrip.traces.carbon import CarbonTrace

    return CarbonTrace(
        ("r",), datetime(2026, 1, 1, tzinfo=UTC), np.zeros(1), np.full((1, 1), 50.0), 1e9, "t", "t"
    )
