"""How ``powertrip experiment`` and ``powertrip curtail`` show a study's progress: per round,
with an ETA, through the one renderer (``progress.py``).

The library stays free of terminal code: ``run_study`` calls ``progress(done, total, label)`` as
each run starts and ends and ``on_round(policy, repeat, record)`` after every round;
``run_curtailment_study`` calls ``progress`` as each run starts (and once at the end) and
``on_round(name, run)`` after every round; the data loaders report to ``on_progress`` (installed
for the study's duration). These classes render all three. Runs are sequential in the CLI's own
process, so a round's event is one direct call (a few microseconds).

The unit is the study's budget: every run has the same budget (``max_rounds`` rounds of a
study; the data stream, in thousandths, of a curtailment run), and a run that ends early
counts its unused budget as done when it ends. The ETA is the remaining budget at the study's
average pace so far (data loading excluded), so it errs long when runs stop early or later
rounds come from the trajectory cache.

On a terminal (stderr) a live bar shows the run, its round and the ETA. Elsewhere (logs, CI,
tests) one line per finished run, and between them a line on the latest round (run i/N, round,
emulated clock, accuracy) at most every ``every_s`` seconds: the study's first round at once,
so a long first run is never silent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Self

from rich.console import Console

from powertrip.services.cli.progress import EVERY_S, ProgressView, format_seconds

if TYPE_CHECKING:
    from powertrip.curtailment.run_model import ElasticRun
    from powertrip.rounds.loop import RoundRecord

__all__ = ["CurtailProgress", "StudyProgress", "format_seconds"]


class RunsProgress:
    """Sequential runs of ``budget`` units each, rendered on ``console``; a context manager
    around the study (it also shows the data loaders' steps)."""

    def __init__(
        self,
        console: Console,
        budget: int,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = EVERY_S,
    ) -> None:
        self.budget, self.clock = budget, clock
        self.view = ProgressView(console, every_s, clock)
        self.runs_done = self.runs_total = self.used = 0  # ``used``: of the current run's budget
        self.label, self.detail = "loading data", ""
        self.said_round = False  # off a terminal, the study's first round is shown at once
        self.started: float | None = None  # at the first run's start: loading is not the pace
        self.step = self.view.step(self.label)
        self._data = self.view.data_steps()

    @property
    def bar(self):  # noqa: ANN201 - rich's Progress on a terminal, else None
        return self.view.bar

    def __enter__(self) -> Self:
        self.view.__enter__()
        self._data.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._data.__exit__(kind, exc, tb)
        if self.view.bar is not None and kind is None:
            self.step.update(self.completed, self.total or None, description="done", last=True)
        self.view.__exit__(kind, exc, tb)

    @property
    def completed(self) -> int:
        """Budget done: every finished run's whole budget, and the current run's so far."""
        return self.runs_done * self.budget + self.used

    @property
    def total(self) -> int:
        return self.runs_total * self.budget

    def eta_s(self) -> float | None:
        """Seconds left at the average pace so far; None before the first unit is done."""
        if self.started is None or self.completed == 0:
            return None
        elapsed = self.clock() - self.started
        return elapsed / self.completed * (self.total - self.completed)

    def _runs(self, done: int, total: int, label: str) -> None:
        """A run starts (``done`` runs finished before it) or ends (``done`` counts it)."""
        if self.started is None:
            self.started = self.clock()
        finished = done > self.runs_done
        self.runs_done, self.runs_total, self.label, self.used = done, total, label, 0
        self.detail = ""
        if self.view.bar is None and finished:  # logs and CI: one line per run
            elapsed = format_seconds(self.clock() - self.started)
            eta = self.eta_s()
            left = "" if eta is None or done == total else f", eta {format_seconds(eta)}"
            self.view.line(f"[{done}/{total}] {label} done ({elapsed}{left})", always=True)
        self._show()
        if self.view.bar is not None:  # a frame per run at least, however fast its rounds
            self.view.bar.refresh()

    def _advance(self, used: int, detail: str) -> None:
        """A round of the current run ended: ``used`` of its budget, ``detail`` says where."""
        self.used, self.detail = min(used, self.budget), detail
        self._show(round_ended=True)

    def _show(self, round_ended: bool = False) -> None:
        run = f"[{min(self.runs_done + 1, self.runs_total)}/{self.runs_total}] {self.label}"
        eta = self.eta_s()
        if self.view.bar is not None:
            self.step.update(
                self.completed,
                self.total,
                description=f"{run} {self.detail}".rstrip(),
                eta_s=eta,
            )
        elif round_ended and self.started is not None:
            elapsed = format_seconds(self.clock() - self.started)
            left = "" if eta is None else f", eta {format_seconds(eta)}"
            self.view.line(f"{run} {self.detail} ({elapsed}{left})", always=not self.said_round)
            self.said_round = True


class StudyProgress(RunsProgress):
    """``run_study``'s ``progress`` and ``on_round`` hooks (``run`` and ``round``): the budget
    is ``max_rounds`` rounds a run."""

    def __init__(
        self,
        console: Console,
        max_rounds: int,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = EVERY_S,
    ) -> None:
        super().__init__(console, max_rounds, clock, every_s)
        self.max_rounds = max_rounds

    @property
    def rounds(self) -> int:
        return self.used

    def run(self, done: int, total: int, label: str) -> None:
        self._runs(done, total, label)

    def round(self, policy: str, repeat: int, record: RoundRecord) -> None:
        """A round of the current run ended."""
        detail = f"round {min(record.round, self.max_rounds)}/{self.max_rounds}"
        if self.view.bar is None:  # a log line has room to say where the run is
            detail += f", clock {format_seconds(record.time_s)}, accuracy {record.accuracy:.3f}"
        self._advance(record.round, detail)


class CurtailProgress(RunsProgress):
    """``run_curtailment_study``'s ``progress`` and ``on_round`` hooks (``run`` and ``round``):
    a run's budget is its data stream (it ends when the data is used up, or the observation
    period ends first), counted in thousandths."""

    PARTS = 1000

    def __init__(
        self,
        console: Console,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = EVERY_S,
    ) -> None:
        super().__init__(console, self.PARTS, clock, every_s)
        self.names: tuple[str, str] = ("", "")  # the run going on, and the one before

    def run(self, done: int, total: int, label: str) -> None:
        """``run_curtailment_study`` reports each run's start (``done`` finished before it) and
        the end of the last: a start also ends the run before it."""
        if done > self.runs_done:  # the previous run ended
            self._runs(done, total, self.label)
        if done < total:
            self._runs(done, total, label)

    def round(self, name: str, run: ElasticRun) -> None:
        """A round of the run ``name`` ended."""
        last = run.rounds[-1]
        share = run.rows_done / run.total_rows if run.total_rows else 0.0
        detail = f"round {last.index}, data {share:.0%}"
        if self.view.bar is None:
            detail += f", clock {format_seconds(last.end_s)}, accuracy {last.accuracy:.3f}"
        self._advance(int(share * self.PARTS), detail)
