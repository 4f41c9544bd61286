"""Telling the profiler which workers to probe, off the registration path.

A registration used to start a thread that called the profiler's ``TrackWorker``: under a
registration storm (200 workers at once) that is 200 threads and 200 concurrent RPCs contending
with the registrations themselves for the GIL, which doubled the storm's p99 latency
(``benchmarks/registration_load.py``: p99 491-550 ms with them, 315-327 ms without any).
``WorkerTracker`` queues the notices instead and sends them from one thread (p99 340-405 ms; two
threads: 447-476 ms). While the profiler is down, one notice at a time waits out its retries
and the rest wait in the queue: they go out as soon as it answers. A worker that registers again
before its notice went out is sent once, with its latest address, and never by two threads at
once, so the profiler cannot end up with an older address than the aggregator has.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

Send = Callable[[str, str, list[str]], None]


class WorkerTracker:
    """Calls ``send(worker_id, address, sites)`` for every ``track`` from ``threads`` background
    threads: latest notice per worker, one notice per worker in flight, oldest first."""

    def __init__(self, send: Send, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError("at least one sender thread is needed")
        self._send = send
        self._pending: dict[str, tuple[str, list[str]]] = {}  # insertion order = arrival order
        self._in_flight: set[str] = set()
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._loop, name=f"track-workers-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def track(self, worker_id: str, address: str, sites: list[str]) -> None:
        """Queue a notice (never blocks on the profiler)."""
        with self._cond:
            self._pending.pop(worker_id, None)  # re-queued behind the others, with the latest
            self._pending[worker_id] = (address, list(sites))
            self._cond.notify()

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether every queued notice was sent (or failed) within ``timeout_s``."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._pending and not self._in_flight, timeout=timeout_s
            )

    def _next(self) -> tuple[str, str, list[str]]:
        with self._cond:
            while True:
                ready = next((w for w in self._pending if w not in self._in_flight), None)
                if ready is not None:
                    address, sites = self._pending.pop(ready)
                    self._in_flight.add(ready)
                    return ready, address, sites
                self._cond.wait()

    def _loop(self) -> None:
        while True:
            worker_id, address, sites = self._next()
            try:
                self._send(worker_id, address, sites)
            except Exception:  # the sender logs its own failures; never lose the thread
                logger.exception("tracking worker %s failed", worker_id)
            finally:
                with self._cond:
                    self._in_flight.discard(worker_id)
                    self._cond.notify_all()  # a newer notice for it may be waiting
