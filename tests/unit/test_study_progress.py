"""A study's progress (``powertrip experiment`` and ``curtail``): the budget advances after every
round, the ETA is the budget left at the pace so far, a terminal gets a live bar and a log a
line per finished run with a line on the latest round between them at a bounded rate, and a
round costs the study next to nothing."""

from __future__ import annotations

import io
import time

from rich.console import Console

from powertrip.curtailment.run_model import ElasticRound, ElasticRun
from powertrip.rounds.loop import RoundRecord
from powertrip.services.cli.study_progress import CurtailProgress, StudyProgress, format_seconds


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _record(r: int) -> RoundRecord:
    return RoundRecord(round=r, time_s=10.0 * r, duration_s=1.0, sites=3, accuracy=0.5, loss=1.0)


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=terminal, width=120), buffer


def test_the_budget_advances_per_round_and_a_run_that_stops_early_counts_its_whole_budget():
    clock = FakeClock()
    shown = StudyProgress(_console(False)[0], max_rounds=10, clock=clock)
    shown.run(0, 4, "static-5 (repeat 1/1)")
    for r in (1, 2, 3):
        clock.now += 2.0
        shown.round("static-5", 0, _record(r))
    assert (shown.completed, shown.total) == (3, 40)
    assert shown.eta_s() == 6.0 / 3 * 37  # 2 s a round, 37 rounds of budget left

    shown.run(1, 4, "static-5 (repeat 1/1)")  # reached its target after 3 rounds
    assert shown.completed == 10


def test_a_log_gets_the_first_round_a_round_every_few_seconds_and_every_finished_run():
    clock = FakeClock()
    console, buffer = _console(False)
    with StudyProgress(console, max_rounds=5, clock=clock, every_s=3.0) as shown:
        for done, label in enumerate(("static-2 (repeat 1/1)", "powertrip (repeat 1/1)")):
            shown.run(done, 2, label)
            for r in range(1, 6):
                clock.now += 1.0  # a round a second, a line at most every 3 s
                shown.round(label, 0, _record(r))
            shown.run(done + 1, 2, label)

    assert buffer.getvalue().splitlines() == [
        "[1/2] static-2 (repeat 1/1) round 1/5, clock 10 s, accuracy 0.500 (1 s, eta 9 s)",
        "[1/2] static-2 (repeat 1/1) round 4/5, clock 40 s, accuracy 0.500 (4 s, eta 6 s)",
        "[1/2] static-2 (repeat 1/1) done (5 s, eta 5 s)",
        "[2/2] powertrip (repeat 1/1) round 3/5, clock 30 s, accuracy 0.500 (8 s, eta 2 s)",
        "[2/2] powertrip (repeat 1/1) done (10 s)",
    ]


def test_a_log_of_ten_thousand_fast_rounds_stays_a_few_lines():
    clock = FakeClock()
    console, buffer = _console(False)
    with StudyProgress(console, max_rounds=10_000, clock=clock, every_s=10.0) as shown:
        shown.run(0, 1, "powertrip (repeat 1/1)")
        for r in range(1, 10_001):
            clock.now += 0.01  # 100 s in all
            shown.round("powertrip", 0, _record(r))
        shown.run(1, 1, "powertrip (repeat 1/1)")
    lines = buffer.getvalue().splitlines()
    assert 10 <= len(lines) <= 12  # the first round, one every 10 s, the run's end
    assert lines[-1] == "[1/1] powertrip (repeat 1/1) done (1 min 40 s)"


def test_a_terminal_gets_a_live_bar_naming_the_run_its_round_and_the_eta():
    clock = FakeClock()
    console, buffer = _console(True)
    with StudyProgress(console, max_rounds=8, clock=clock) as shown:
        shown.run(0, 3, "powertrip (repeat 1/1)")
        clock.now += 4.0
        shown.round("powertrip", 0, _record(2))
        task = shown.bar.tasks[0]
        assert task.description == "[1/3] powertrip (repeat 1/1) round 2/8"
        assert (task.completed, task.total) == (2, 24)
        assert task.fields["eta"] == "eta 44 s"
    assert shown.bar.tasks[0].description == "done"  # and so drawn last
    assert "done" in buffer.getvalue() and "8%" in buffer.getvalue()


def _elastic_run(rows_done: int, rounds: int) -> ElasticRun:
    run = ElasticRun(policy="curtailment", sites=(), total_rows=1000, rows_done=rows_done)
    run.rounds = [
        ElasticRound(i, 0.0, 0.0, 0.0, 3600.0 * i, (), 0.25, 2.0) for i in range(1, 1 + rounds)
    ]
    return run


def test_a_curtailment_run_advances_by_its_data_and_ends_when_the_next_starts():
    """``run_curtailment_study`` says only when each run starts (and when all are done): the
    start of the next run is the end of the one before."""
    clock = FakeClock()
    console, buffer = _console(False)
    with CurtailProgress(console, clock=clock, every_s=60.0) as shown:
        shown.run(0, 2, "curtailment")
        clock.now += 5.0
        shown.round("curtailment", _elastic_run(250, 1))
        assert (shown.completed, shown.total) == (250, 2000)
        clock.now += 5.0
        shown.run(1, 2, "single-site")
        assert shown.completed == 1000
        clock.now += 5.0
        shown.run(2, 2, "done")

    assert buffer.getvalue().splitlines() == [
        "[1/2] curtailment round 1, data 25%, clock 1 h 00 min, accuracy 0.250 (5 s, eta 35 s)",
        "[1/2] curtailment done (10 s, eta 10 s)",
        "[2/2] single-site done (15 s)",
    ]


def test_durations_read_in_the_largest_sensible_unit():
    assert [format_seconds(s) for s in (4.4, 65, 7620)] == ["4 s", "1 min 05 s", "2 h 07 min"]


def test_a_round_event_costs_microseconds_on_a_terminal():
    """The cheapest of five batches (a loaded machine slows some, not all): a round updates a
    counter and rich's task; drawing is rich's own thread's, four times a second."""
    console, _ = _console(True)
    with StudyProgress(console, max_rounds=1000) as shown:
        shown.run(0, 10, "powertrip (repeat 1/1)")
        batches = []
        for batch in range(5):
            started = time.perf_counter()
            for r in range(batch * 200 + 1, batch * 200 + 201):
                shown.round("powertrip", 0, _record(r))
            batches.append((time.perf_counter() - started) / 200)
    assert min(batches) < 1e-3  # the quick preset's rounds take tens of milliseconds each
