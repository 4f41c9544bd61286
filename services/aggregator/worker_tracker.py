"""Telling the profiler which workers to probe, off the registration path.

A registration used to start a thread that called the profiler's ``TrackWorker``: under a
registration storm (200 workers at once) that is 200 threads and 200 concurrent RPCs contending
with the registrations themselves for the GIL (``benchmarks/registration_load.py``: p99 491-550
ms with them, 315-327 ms without any). ``WorkerTracker`` queues the notices instead and sends
them from one thread (p99 340-405 ms; two threads measured 447-476 ms). While the profiler is
down, one notice at a time waits out its retries and the rest wait in the queue: they go out as
soon as it answers. A worker that registers again before its notice went out is sent once, with
its latest address, so the profiler cannot end up with an older address than the aggregator has.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

Send = Callable[[str, str, list[str]], None]


class WorkerTracker:
    """Calls ``send(worker_id, address, sites)`` for every ``track`` from one background thread:
    the latest notice per worker, oldest first."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._pending: dict[str, tuple[str, list[str]]] = {}  # insertion order = arrival order
        self._sending = False
        self._cond = threading.Condition()
        threading.Thread(target=self._loop, name="track-workers", daemon=True).start()

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
                lambda: not self._pending and not self._sending, timeout=timeout_s
            )

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending)
                worker_id = next(iter(self._pending))
                address, sites = self._pending.pop(worker_id)
                self._sending = True
            try:
                self._send(worker_id, address, sites)
            except Exception:  # the sender logs its own failures; never lose the thread
                logger.exception("tracking worker %s failed", worker_id)
            finally:
                with self._cond:
                    self._sending = False
                    self._cond.notify_all()
