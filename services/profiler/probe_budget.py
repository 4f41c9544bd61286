"""Bounding and reporting the profiler's probe traffic.

The profiler caps bulk probe bytes over any trailing hour (``ProbeBudget``, set by
``POWERTRIP_PROBE_BUDGET_BYTES_PER_HOUR``), and ``probe_share`` reports what fraction of all
bytes on the links were probes rather than training: the profiler's
``powertrip_probe_bytes_total`` against the aggregator's ``powertrip_update_bytes_total`` +
``powertrip_model_broadcast_bytes_total``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from prometheus_client.parser import text_string_to_metric_families

HOUR_S = 3600.0
PROBE_BYTES = "powertrip_probe_bytes_total"
TRAINING_BYTES = ("powertrip_update_bytes_total", "powertrip_model_broadcast_bytes_total")


class ProbeBudget:
    """At most ``bytes_per_hour`` probe bytes in any trailing ``window_s`` (thread-safe)."""

    def __init__(
        self,
        bytes_per_hour: int,
        window_s: float = HOUR_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if bytes_per_hour < 0:
            raise ValueError(f"probe budget must be >= 0 bytes, got {bytes_per_hour}")
        self.limit = bytes_per_hour
        self.window_s = window_s
        self._clock = clock
        self._spent: deque[tuple[float, int]] = deque()
        self._total = 0
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        while self._spent and self._spent[0][0] <= now - self.window_s:
            self._total -= self._spent.popleft()[1]

    def used(self) -> int:
        """Bytes spent in the trailing window."""
        with self._lock:
            self._expire(self._clock())
            return self._total

    def try_spend(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` if they fit in the window; False (and nothing reserved) if not."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            if self._total + nbytes > self.limit:
                return False
            self._spent.append((now, nbytes))
            self._total += nbytes
            return True


def probe_share(probe_bytes: float, update_bytes: float, broadcast_bytes: float) -> float:
    """Probe bytes as a fraction of all bytes moved (probes + updates + model broadcasts)."""
    if min(probe_bytes, update_bytes, broadcast_bytes) < 0:
        raise ValueError("byte counts must be >= 0")
    total = probe_bytes + update_bytes + broadcast_bytes
    return probe_bytes / total if total else 0.0


def _counter_sum(texts: Iterable[str], name: str) -> float:
    total = 0.0
    for text in texts:
        for family in text_string_to_metric_families(text):
            total += sum(s.value for s in family.samples if s.name == name)
    return total


def probe_share_from_metrics(profiler_text: str, aggregator_text: str) -> float:
    """``probe_share`` from two Prometheus scrapes (the /metrics text of each service)."""
    update, broadcast = (_counter_sum([aggregator_text], n) for n in TRAINING_BYTES)
    return probe_share(_counter_sum([profiler_text], PROBE_BYTES), update, broadcast)
