"""One clock abstraction: wall time for deployments, emulated time for studies."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the run started."""
        ...


class EmulatedClock:
    """Time advances only when the emulator says a round (or a pause) took that long."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = float(start_s)

    def now(self) -> float:
        return self._now

    def resume_at(self, now_s: float) -> None:
        """Continue a run whose clock read ``now_s`` (a resumed checkpoint)."""
        self._now = float(now_s)

    def advance(self, seconds: float) -> float:
        if not 0 <= seconds < float("inf"):
            raise ValueError(f"cannot advance the clock by {seconds} s")
        self._now += seconds
        return self._now


class WallClock:
    """Monotonic wall time from construction; immune to NTP steps."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._start

    def resume_at(self, now_s: float) -> None:
        """Count on from ``now_s`` (a resumed checkpoint's clock), as if started that long ago."""
        self._start = time.monotonic() - float(now_s)
