"""The one way a ``powertrip`` command shows progress while a user waits.

On a terminal (the console it draws on, stderr) each step is a rich bar with its ETA; anywhere
else (logs, CI, a pipe) it prints plain lines: the first of the view at once, then at most one
every ``every_s`` seconds, plus each step's last, so a log says what is going on without a
flood (a 10,000-round study writes about a line every 10 s, not 10,000). The library reports
through callbacks (``run_study``'s ``progress``/``on_round``, the data loaders'
``on_progress(done, total, note)``, see ``powertrip.learning.datasets.progress``); only this
module renders them.

The ETA is the step's average pace so far (``Step.update(eta_s=...)`` overrides it where the
caller knows better), so it errs long when a step speeds up, and short when it slows down.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["EVERY_S", "ProgressView", "Step", "format_seconds"]

#: off a terminal, at most one line this often (plus each step's last)
EVERY_S = 10.0


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3 min 05 s`` or ``2 h 07 min``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class ProgressView:
    """Every step a command shows, on ``console``; a context manager around the work (a
    terminal's bars are drawn from rich's own thread, four times a second)."""

    def __init__(
        self,
        console: Console,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console, self.every_s, self.clock = console, every_s, clock
        self.last_line = -math.inf  # when the last plain line was printed
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
        self._data: Step | None = None  # the data step being reported (``on_progress``)

    def __enter__(self) -> ProgressView:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.bar is not None:
            self.bar.stop()

    def step(self, description: str, total: int | None = None, done: int = 0) -> Step:
        """A new step (a bar of its own on a terminal), ``done`` units in; ``total`` None: not
        known yet."""
        return Step(self, description, total, done)

    def line(self, text: str, always: bool = False) -> None:
        """Off a terminal: print ``text`` unless a line was printed less than ``every_s`` ago
        (or ``always``: a step's last line, the first of a study's rounds)."""
        now = self.clock()
        if always or now - self.last_line >= self.every_s:
            self.console.print(text, highlight=False, markup=False)
            self.last_line = now

    def on_progress(self, done: int, total: int, note: str) -> None:
        """The library's ``on_progress(done, total, note)`` callback: a new ``note`` is a new
        step; ``done == total`` ends it."""
        if self._data is None or self._data.description != note:
            if self._data is not None and not self._data.ended:
                self._data.update(self._data.done, last=True)
            self._data = self.step(note, total)
        self._data.update(done, total, last=done >= total)

    @contextmanager
    def data_steps(self) -> Iterator[None]:
        """Show the data loaders' reports in this context (``progress_to``, imported here: the
        library's data package is heavy and the CLI's help must not load it)."""
        from powertrip.learning.datasets.progress import progress_to

        with progress_to(self.on_progress):
            yield


class Step:
    """One thing being waited for: ``done`` of ``total`` units, since ``started``."""

    def __init__(
        self, view: ProgressView, description: str, total: int | None, done: int = 0
    ) -> None:
        self.view, self.description, self.total = view, description, total
        self.done, self.ended, self.detail = done, False, ""
        self.started = view.clock()
        self.first = (self.started, done)  # the pace counts from here
        self.task: TaskID | None = None
        if view.bar is not None:
            self.task = view.bar.add_task(description, total=total, completed=done, eta="")

    def eta_s(self) -> float | None:
        """Seconds left at the average pace since the step began (one that begins part done,
        like a run first seen at its first round, has no pace until its next unit); None
        before there is one."""
        if self.total is None:
            return None
        at, done = self.first
        elapsed, units = self.view.clock() - at, self.done - done
        if units <= 0 or elapsed <= 0:
            return None
        return elapsed / units * max(self.total - self.done, 0)

    def update(
        self,
        done: int,
        total: int | None = None,
        *,
        description: str | None = None,
        detail: str = "",
        eta_s: float | None = None,
        last: bool = False,
        always: bool = False,
    ) -> None:
        """``done`` units are finished; ``detail`` replaces the count off a terminal and follows
        the description on one (``round 3/40, ...``); ``last`` ends the step; its line, and an
        ``always`` one, are printed whatever the rate."""
        self.done, self.detail = done, detail
        self.total = self.total if total is None else total
        self.description = self.description if description is None else description
        self.ended = last
        eta = self.eta_s() if eta_s is None else eta_s
        eta_text = "" if eta is None or last else f"eta {format_seconds(eta)}"
        bar = self.view.bar
        if bar is not None and self.task is not None:
            text = f"{self.description} {detail}".rstrip()
            bar.update(self.task, description=text, completed=done, total=self.total, eta=eta_text)
            return
        count = f"{done}/{self.total}" if self.total is not None else str(done)
        if self.total == 1:  # one indivisible step: it starts, then it is done
            count = "done" if done else "started"
        elapsed = format_seconds(self.view.clock() - self.started)
        times = ", ".join(x for x in (elapsed, eta_text) if x)
        what = detail or count
        self.view.line(f"{self.description}: {what} ({times})", always=last or always)
