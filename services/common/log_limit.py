"""Rate-limited logging: a flood of bad requests must not become a flood of log lines.

``LogLimiter`` lets at most ``burst`` lines per key through in each ``interval_s`` window and
counts the rest; when a key's window ends with lines held back it logs one summary line,
``suppressed K similar lines (KEY) in the last N s``. Windows are checked on every call, so the
summary comes with the next rate-limited event of any key (or an explicit ``flush``), without a
background thread. Keys should come from a bounded set (method and status code, never the peer or
the request's content); past ``max_keys`` live windows every new key shares one overflow window.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

OVERFLOW_KEY = "(other)"


@dataclass
class _Window:
    start: float
    used: int = 0
    suppressed: int = 0


class LogLimiter:
    def __init__(
        self,
        burst: int = 5,
        interval_s: float = 60.0,
        logger: logging.Logger | None = None,
        max_keys: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if burst < 1 or interval_s <= 0 or max_keys < 1:
            raise ValueError("need burst >= 1, interval_s > 0 and max_keys >= 1")
        self.burst = burst
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._logger = logger or logging.getLogger(__name__)
        self._clock = clock
        self._windows: dict[Hashable, _Window] = {}
        self._next_roll = float("inf")
        self._lock = threading.Lock()

    def allow(self, key: Hashable) -> bool:
        """True if a line for ``key`` may be logged now; False counts it as suppressed."""
        now = self._clock()
        with self._lock:
            ended = self._roll(now)
            if key not in self._windows and len(self._windows) >= self.max_keys:
                key = OVERFLOW_KEY
            w = self._windows.get(key)
            if w is None:
                w = self._windows[key] = _Window(now)
                self._next_roll = min(self._next_roll, now + self.interval_s)
            allowed = w.used < self.burst
            if allowed:
                w.used += 1
            else:
                w.suppressed += 1
        self._report(ended)
        return allowed

    def flush(self) -> None:
        """Report every window that has ended with lines held back (e.g. before exiting)."""
        with self._lock:
            ended = self._roll(self._clock())
        self._report(ended)

    def suppressed(self, key: Hashable) -> int:
        """Lines held back so far in ``key``'s current window."""
        with self._lock:
            w = self._windows.get(key)
            return w.suppressed if w else 0

    def _roll(self, now: float) -> list[tuple[Hashable, int, float]]:
        """Drop the windows that have ended; (key, suppressed, seconds) for those that held any
        line back. Called with the lock held; cheap until the earliest window ends."""
        if now < self._next_roll:
            return []
        ended = []
        self._next_roll = float("inf")
        for key, w in list(self._windows.items()):
            if now - w.start >= self.interval_s:
                del self._windows[key]
                if w.suppressed:
                    ended.append((key, w.suppressed, now - w.start))
            else:
                self._next_roll = min(self._next_roll, w.start + self.interval_s)
        return ended

    def _report(self, ended: list[tuple[Hashable, int, float]]) -> None:
        for key, count, seconds in ended:
            self._logger.warning(
                "suppressed %d similar lines (%s) in the last %.0f s",
                count,
                _describe(key),
                seconds,
            )


def _describe(key: Hashable) -> str:
    if isinstance(key, tuple):
        return " ".join(str(part) for part in key)
    return str(key)


def one_line(text: str, limit: int = 200) -> str:
    """``text`` made safe for a single log line: whitespace collapsed, control characters
    replaced, cut to ``limit`` characters (client-supplied ids can be anything)."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 3] + "..."
    return "".join(c if c.isprintable() else "?" for c in flat)
