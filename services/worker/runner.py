"""The worker's training thread: one round at a time, newest round first, paced by power.

In wall-clock mode a site at power fraction P releases its update ``train_seconds / P`` after
training started (the PowerTrip paper's §5.1 emulation of a power cap: the work is done at full
speed, the result is held back as if the site had computed at P). A round superseded by a newer
one before it starts is dropped: its updates would be stale.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np
from numpy.typing import NDArray

from powertrip.services.common.errors import Busy
from powertrip.services.worker import metrics
from powertrip.services.worker.site_host import RoundJob, SiteHost, SiteUpdate
from powertrip.sites.profiles import site_id
from powertrip.v1 import common_pb2

__all__ = ["RoundJob", "RoundRunner", "Uploader", "release_delays"]

logger = logging.getLogger(__name__)

#: sends one site's update; raises on failure. Arguments: round, update, timeout seconds.
Uploader = Callable[[int, SiteUpdate, float], None]


def release_delays(updates: list[SiteUpdate], power: Mapping[int, float]) -> list[float]:
    """Seconds after training started at which each site's update may leave."""
    return [u.train_seconds / min(max(power.get(u.site, 1.0), 1e-3), 1.0) for u in updates]


class RoundRunner:
    def __init__(self, upload: Uploader) -> None:
        self._upload = upload
        self._host: SiteHost | None = None
        self._pending: RoundJob | None = None
        self._cv = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="round-runner", daemon=True)
        self.completed_rounds = 0

    def start(self, host: SiteHost | None) -> None:
        """Train rounds on ``host`` from now on (None: refuse them as Busy until a host is
        given again: a worker rebuilding its sites for another run). A host replaced here is
        closed once no round is using it."""
        with self._cv:
            old, self._host = self._host, host
        if old is not None and old is not host:
            old.close()
        if self._thread.ident is None:
            self._thread.start()

    def stop(self) -> None:
        """Take no new round; the one in hand stops before its next site's upload or wait."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()

    def join(self, timeout_s: float) -> bool:
        """Wait for the training thread to end; True when it has (or never started)."""
        if self._thread.is_alive():
            self._thread.join(max(0.0, timeout_s))
        return not self._thread.is_alive()

    @property
    def ready(self) -> bool:
        return self._host is not None

    def round_inputs(self, spec: common_pb2.RoundSpec) -> dict[int, NDArray[np.int64]] | None:
        """The host's part of ``spec``, checked before the model is read (ValueError)."""
        host = self._host
        if host is None:
            raise Busy("the worker is still loading its sites; retry shortly")
        return host.round_inputs(spec)

    def submit(self, job: RoundJob) -> None:
        if self._host is None:
            raise Busy("the worker is still loading its sites; retry shortly")
        with self._cv:
            if self._pending is not None:
                logger.warning(
                    "round %d superseded by round %d before it started",
                    self._pending.round,
                    job.round,
                )
                metrics.ROUNDS.labels("superseded").inc(len(self._pending.sites))
            self._pending = job
            self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._stopped:
                    self._cv.wait()
                if self._stopped or self._pending is None:
                    return
                job, self._pending = self._pending, None
            try:
                self._run(job)
            except Exception:
                logger.exception("round %d failed on this worker", job.round)
                metrics.ROUNDS.labels("failed").inc(len(job.sites))

    def _run(self, job: RoundJob) -> None:
        host = self._host
        if host is None:
            raise Busy("the worker is rebuilding its sites")
        started = time.monotonic()
        updates = host.run_round(job)
        delays = release_delays(updates, job.power) if job.pace_by_power else [0.0] * len(updates)
        for delay, update in sorted(zip(delays, updates, strict=True), key=lambda p: p[0]):
            name = site_id(update.site)
            metrics.TRAIN_DURATION.labels(name).observe(update.train_seconds)
            metrics.SAMPLES.labels(name).inc(update.num_samples)
            metrics.POWER.labels(name).set(job.power.get(update.site, 1.0))
            with self._cv:  # the power-paced hold; stop() cuts it short
                self._cv.wait_for(lambda: self._stopped, started + delay - time.monotonic())
            if self._stopped:
                logger.info("round %d: stopping, %s and later sites not sent", job.round, name)
                return
            remaining = job.received_at + job.deadline_s - time.monotonic()
            if remaining <= 0:
                logger.warning("round %d: %s missed the deadline, not sent", job.round, name)
                metrics.ROUNDS.labels("late").inc()
                continue
            try:
                self._upload(job.round, update, remaining)
                metrics.ROUNDS.labels("uploaded").inc()
                metrics.UPDATE_BYTES.labels(name, "up").inc(
                    sum(int(np.asarray(v).nbytes) for v in update.delta.values())
                )
            except Exception as exc:  # one site's failed upload must not stop the others
                logger.warning("round %d: upload of %s failed: %s", job.round, name, exc)
                metrics.ROUNDS.labels("upload_failed").inc()
        self.completed_rounds += 1
