"""How ``powertrip experiment`` shows a study's progress: per round, with an ETA.

The library stays free of terminal code: ``run_study`` calls ``progress(done, total, label)`` as
each run starts and ends and ``on_round(policy, repeat, record)`` after every round, and this
class renders both. Runs are sequential in the CLI's own process (no worker processes), so a
round's event is one direct call: it updates a counter and a rich task (a few microseconds per
round; rich redraws from its own thread, four times a second).

The unit is the study's round budget: every run may take up to ``max_rounds`` rounds, and a run
that reaches its target early counts its unused rounds as done when it ends. The ETA is the
remaining budget at the study's average pace so far (data loading excluded), so it errs long when
runs stop early or later rounds come from the trajectory cache.

On a terminal (the console the progress writes to, stderr) a live bar shows the run, its round
and the ETA; elsewhere (logs, CI, tests) it prints one line per finished run, nothing per round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from powertrip.rounds.loop import RoundRecord

__all__ = ["StudyProgress", "format_seconds"]


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3 min 05 s`` or ``2 h 07 min``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class StudyProgress:
    """``run_study``'s ``progress`` and ``on_round`` hooks (``run`` and ``round``), rendered on
    ``console``; a context manager around the study."""

    def __init__(
        self, console: Console, max_rounds: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.console, self.max_rounds, self.clock = console, max_rounds, clock
        self.runs_done = self.runs_total = self.rounds = 0
        self.label = "loading data"
        self.started: float | None = None  # at the first run's start: loading is not the pace
        self.bar: Progress | None = None
        if console.is_terminal:
            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[eta]}"),
                console=console,
                refresh_per_second=4,
            )
            self.task = self.bar.add_task(self.label, total=None, eta="")

    def __enter__(self) -> StudyProgress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.bar is not None:
            if kind is None:
                self.bar.update(self.task, description="done", eta="")
            self.bar.stop()

    @property
    def completed(self) -> int:
        """Rounds of the budget done: every finished run's whole budget, and the current run's."""
        return self.runs_done * self.max_rounds + self.rounds

    @property
    def total(self) -> int:
        return self.runs_total * self.max_rounds

    def eta_s(self) -> float | None:
        """Seconds left at the average pace so far; None before the first round is done."""
        if self.started is None or self.completed == 0:
            return None
        elapsed = self.clock() - self.started
        return elapsed / self.completed * (self.total - self.completed)

    def run(self, done: int, total: int, label: str) -> None:
        """A run starts (``done`` runs finished before it) or ends (``done`` counts it)."""
        if self.started is None:
            self.started = self.clock()
        finished = done > self.runs_done
        self.runs_done, self.runs_total, self.label, self.rounds = done, total, label, 0
        if self.bar is None and finished:  # logs and CI: one line per run
            elapsed = format_seconds(self.clock() - self.started)
            eta = self.eta_s()
            left = "" if eta is None or done == total else f", eta {format_seconds(eta)}"
            self.console.print(f"[{done}/{total}] {label} done ({elapsed}{left})", highlight=False)
        self._show()

    def round(self, policy: str, repeat: int, record: RoundRecord) -> None:
        """A round of the current run ended."""
        self.rounds = min(record.round, self.max_rounds)
        self._show()

    def _show(self) -> None:
        if self.bar is None:
            return
        run = f"[{min(self.runs_done + 1, self.runs_total)}/{self.runs_total}] {self.label}"
        eta = self.eta_s()
        self.bar.update(
            self.task,
            description=f"{run} round {self.rounds}/{self.max_rounds}",
            completed=self.completed,
            total=self.total,
            eta="" if eta is None else f"eta {format_seconds(eta)}",
        )
