"""The worker allow-list: a static set plus a file re-read when it changes (live revocation).

POWERTRIP_ALLOWED_WORKERS ("w0,w1") is fixed for the life of the process;
POWERTRIP_ALLOWED_WORKERS_FILE (one id per line, ``#`` starts a comment) is re-read when its
mtime or size changes, checked with one ``stat`` at most every ``check_every_s`` (1 s). A worker
is admitted if either names it. Removing an id from the file therefore takes effect on that
worker's next call (heartbeat, update, status) without a restart; an id in the static list can
only be removed by a restart.

A file that becomes bad (unreadable, an invalid id on line N) keeps the last good list and logs
one line naming the file and the line; at start a bad file is a configuration error instead.
``WatchedFile`` is that reload machinery on its own, shared with the site owners map.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Generic, TypeVar

from powertrip.services.common.identity import id_problem

logger = logging.getLogger(__name__)
T = TypeVar("T")
#: an admission check: None when admitted, else the refusal reason (``not_allowed``, ...)
Verdict = Callable[[str], str | None]


def read_ids(path: str | Path) -> frozenset[str]:
    """The ids in the file; ValueError naming the file (and the line) if it is unusable."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"allow-list file {str(path)!r} unreadable: {exc}") from None
    ids = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        problem = id_problem(line)
        if problem:
            raise ValueError(f"allow-list file {str(path)!r} line {n}: {problem}")
        ids.append(line)
    return frozenset(ids)


def _signature(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class WatchedFile(Generic[T]):
    """A file's parsed value, re-parsed when its mtime or size changes.

    One ``stat`` at most every ``check_every_s``, so calling ``value()`` on every request is
    cheap. At start a bad file raises (ValueError from ``parse``: a configuration error); later,
    a bad version is logged once (``parse``'s message should name the file and line) and the
    last good value kept, so a half-saved edit cannot lock every worker out.
    ``on_change(old, new)`` runs, under the lock, when a new good version replaces the old."""

    def __init__(
        self,
        path: str,
        parse: Callable[[str], T],
        check_every_s: float = 1.0,
        on_change: Callable[[T, T], None] | None = None,
    ) -> None:
        self.path = path
        self._parse = parse
        self.check_every_s = check_every_s
        self._on_change = on_change
        self._lock = threading.Lock()
        self._sig = _signature(path)
        self._value = parse(path)
        self._next_check = time.monotonic() + check_every_s

    def value(self) -> T:
        with self._lock:
            now = time.monotonic()
            if now < self._next_check:
                return self._value
            self._next_check = now + self.check_every_s
            sig = _signature(self.path)
            if sig == self._sig:
                return self._value
            self._sig = sig  # a bad version is reported once, not on every check
            try:
                new = self._parse(self.path)
            except ValueError as exc:
                logger.error("%s; keeping the previous version", exc)
                return self._value
            old, self._value = self._value, new
            if self._on_change is not None:
                self._on_change(old, new)
            return new


class AllowList:
    """``verdict(worker_id)``: None when admitted, else ``not_allowed`` or ``revoked``.

    With neither a static set nor a file, everyone is admitted (no allow-list)."""

    def __init__(
        self,
        static: Collection[str] | None = None,
        path: str | None = None,
        check_every_s: float = 1.0,
    ) -> None:
        self.static = frozenset(static) if static else None
        self.path = path
        self._ever: set[str] = set(self.static or ())  # ids once admitted: gone is "revoked"
        self._file: WatchedFile[frozenset[str]] | None = None
        if path is not None:  # at start a bad file is an error, not a warning
            self._file = WatchedFile(path, read_ids, check_every_s, self._changed)
            self._ever |= self._file.value()

    def _changed(self, old: frozenset[str], new: frozenset[str]) -> None:
        removed = old - new
        if removed:
            logger.warning("allow-list %s: revoked %s", self.path, ", ".join(sorted(removed)))
        self._ever = self._ever | new  # swapped whole: verdict() reads it without a lock

    @property
    def active(self) -> bool:
        return self.static is not None or self.path is not None

    def verdict(self, worker_id: str) -> str | None:
        if not self.active:
            return None
        ids = self._file.value() if self._file is not None else frozenset()
        if (self.static and worker_id in self.static) or worker_id in ids:
            return None
        return "revoked" if worker_id in self._ever else "not_allowed"

    __call__ = verdict


def all_of(*verdicts: Verdict) -> Verdict:
    """One admission check from several: a worker must pass each (the first refusal wins)."""

    def verdict(worker_id: str) -> str | None:
        for check in verdicts:
            reason = check(worker_id)
            if reason is not None:
                return reason
        return None

    return verdict
