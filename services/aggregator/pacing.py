"""Pacing (POWERTRIP_PACE): an emulated run stretched over wall time, for both run modes."""

from __future__ import annotations

import time
from collections.abc import Callable


class Pacer:
    """Holds an emulated run to ``pace`` run-clock seconds per wall second (0: no holding).

    An unpaced emulated run squeezes hours of run clock into seconds, too fast for a Prometheus
    at a normal scrape interval to see it unfold. The hold is a wait between rounds, after the
    round's metrics are set and before the next round starts; on the emulated clock nothing
    that decides a round reads wall time, so a paced run makes the same decisions and reports
    the same results.
    Rounds slower than the pace are not made up for: pacing only ever adds waiting.
    """

    def __init__(self, pace: float, wall: Callable[[], float] = time.monotonic) -> None:
        self.pace = pace
        self._wall = wall
        self._origin = (wall(), 0.0)  # (wall, run clock) the pace counts from

    def restart(self, clock_s: float = 0.0) -> None:
        """Count from now at run clock ``clock_s``: when training starts, and after each round
        a restarted run replays (a replay catches up at full speed)."""
        self._origin = (self._wall(), clock_s)

    def hold_s(self, clock_s: float) -> float:
        """Wall seconds to wait until the run clock ``clock_s`` is due at this pace."""
        if self.pace <= 0:
            return 0.0
        wall0, clock0 = self._origin
        return max(0.0, wall0 + (clock_s - clock0) / self.pace - self._wall())
