"""How slow data preparation says how far it has got, with no terminal code in the library.

Reading 100 k speech clips, generating a corpus or training a tokenizer takes seconds to
minutes, several calls below the command that waits for it (a study loads its workload through
``federation.load_workload``). Rather than thread a callback through every layer between, the
command installs one for the duration of its work (``progress_to``) and the loaders report to
whatever is installed (``report``, ``counted``): nothing when nobody listens, which is the
services' and the tests' case. The callback is the ``on_progress(done, total, note)`` protocol:
``note`` names the step (a new note is a new step), ``done`` of ``total`` units are finished
and ``done == total`` ends the step. Rendering (a bar, rate-limited log lines) is the CLI's
(``services/cli/progress.py``).

A context variable rather than a module global: two studies in two threads each report to their
own command. A loader captures the callback when it starts (``counted``, ``sink``), so work it
hands to another thread (the tokenizer's iterator) still reports to the right place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

__all__ = ["Meter", "OnProgress", "counted", "progress_to", "report", "sink"]

#: ``on_progress(done, total, note)``: ``done`` of ``total`` units of the step ``note`` are done
OnProgress = Callable[[int, int, str], None]
T = TypeVar("T")

_INSTALLED: ContextVar[OnProgress | None] = ContextVar("powertrip_progress", default=None)
#: reports per step at most (plus its first and last): a step over a million items costs a
#: thousand calls, not a million
_MAX_REPORTS = 1000


@contextmanager
def progress_to(on_progress: OnProgress | None) -> Iterator[None]:
    """Send the loaders' reports in this context to ``on_progress`` (None: to nobody)."""
    token = _INSTALLED.set(on_progress)
    try:
        yield
    finally:
        _INSTALLED.reset(token)


def sink() -> OnProgress | None:
    """The callback installed now, to report from another thread later; None: nobody listens."""
    return _INSTALLED.get()


def report(done: int, total: int, note: str) -> None:
    """``done`` of ``total`` units of the step ``note`` are finished (a no-op unless installed)."""
    on_progress = _INSTALLED.get()
    if on_progress is not None:
        on_progress(done, total, note)


class Meter:
    """A step measured in units (bytes, rows, items) of a known ``total``: ``meter(done)``
    reports about every thousandth of the way and always the end, to the callback installed
    when the meter was made (so any thread may advance it)."""

    def __init__(self, total: int, note: str) -> None:
        self.total, self.note, self.on_progress = total, note, _INSTALLED.get()
        self.every = max(1, total // _MAX_REPORTS)
        self.due = 0

    def __call__(self, done: int) -> None:
        if self.on_progress is None or (done < self.due and done < self.total):
            return
        self.on_progress(min(done, self.total), self.total, self.note)
        self.due = done + self.every


def counted(items: Sequence[T], note: str) -> Iterator[T]:
    """``items``, reporting the step ``note`` as they are consumed: 0 before the first, then
    about every thousandth of the way, and ``len(items)`` after the last."""
    meter = Meter(len(items), note)
    meter(0)
    for i, item in enumerate(items, 1):
        yield item
        meter(i)
