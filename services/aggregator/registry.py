"""Which worker hosts which site, where to reach it, and whether it is alive.

Liveness is a lease: every RegisterWorker (workers re-register every POWERTRIP_HEARTBEAT_S as a
heartbeat) renews its worker's lease, and a worker is alive while its last heartbeat is at most
``lease_s`` old. A SIGKILLed or frozen worker stops beating, so it goes offline within one lease
whatever the round is doing, and its sites are not selected until it beats again. The registry
is the one place that knows worker ids; it logs one line and counts each transition.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from powertrip.services.aggregator import metrics
from powertrip.services.common.errors import BadRequest, Duplicate, NotFound
from powertrip.sites.profiles import SiteProfile, site_id

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Worker:
    worker_id: str
    address: str
    sites: tuple[int, ...]
    ready: bool = True  # sites loaded: can train when a round starts


class WorkerRegistry:
    def __init__(
        self,
        num_sites: int,
        lease_s: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.num_sites = num_sites
        self.lease_s = lease_s
        self._clock = clock
        self._workers: dict[str, Worker] = {}
        self._site_owner: dict[int, str] = {}
        self._last_seen: dict[str, float] = {}
        self._offline: set[str] = set()  # workers whose lease ran out, until they beat again
        self._lock = threading.Lock()

    def register(
        self,
        worker_id: str,
        address: str,
        sites: Sequence[int],
        ready: bool = True,
        entitled: bool = False,
    ) -> tuple[Worker, bool]:
        """Add or replace a worker (a restarted worker re-registers under its id).

        Returns (worker, changed): workers re-register periodically as a heartbeat, so that an
        aggregator restarted from a checkpoint finds them again; ``changed`` is False for those.
        A site another worker holds is Duplicate, unless that worker's lease has run out (the
        squatter went away) or the claimant is ``entitled`` (the site owners map assigns it
        the sites): then the site moves, so the rightful worker is never locked out.
        """
        if not worker_id or not address:
            raise BadRequest("registration needs worker_id and address")
        if not sites:
            raise BadRequest(f"worker {worker_id!r} registered no site")
        outside = [site_id(s) for s in sites if not 0 <= s < self.num_sites]
        if outside:
            raise NotFound(f"sites {outside} are not in this run ({self.num_sites} sites)")
        with self._lock:
            now = self._clock()
            moved: dict[int, str] = {}
            for s in sites:
                owner = self._site_owner.get(s)
                if owner is None or owner == worker_id:
                    continue
                if not entitled and self._alive(owner, now):
                    raise Duplicate(f"{site_id(s)} is already hosted by worker {owner!r}")
                moved[s] = owner
            for s, owner in moved.items():
                self._release(s, owner, worker_id, entitled)
            self._last_seen[worker_id] = now  # any registration renews the lease
            if worker_id in self._offline:
                self._offline.discard(worker_id)
                logger.info("worker %s is back (heartbeat received)", worker_id)
            old = self._workers.get(worker_id)
            worker = Worker(worker_id, address, tuple(sorted(set(sites))), ready)
            if old == worker:
                self._publish()
                return old, False
            if old is not None:
                for s in old.sites:
                    self._site_owner.pop(s, None)
            self._workers[worker_id] = worker
            for s in worker.sites:
                self._site_owner[s] = worker_id
            self._publish()
            return worker, True

    def _release(self, site: int, owner: str, to: str, entitled: bool) -> None:
        """Take ``site`` from ``owner`` (under the lock); a worker left with no site is gone."""
        old = self._workers[owner]
        rest = tuple(s for s in old.sites if s != site)
        del self._site_owner[site]
        if rest:
            self._workers[owner] = replace(old, sites=rest)
        else:
            del self._workers[owner]
            self._last_seen.pop(owner, None)
            self._offline.discard(owner)
        why = "assigned to it" if entitled else f"{owner!r}'s lease ran out"
        logger.warning("%s moves from worker %r to %r (%s)", site_id(site), owner, to, why)

    # -- leases --------------------------------------------------------------------------
    def _alive(self, worker_id: str, now: float) -> bool:
        seen = self._last_seen.get(worker_id)
        return seen is not None and now - seen <= self.lease_s

    def sweep(self) -> list[str]:
        """Mark the workers whose lease ran out offline (one log line and one count each) and
        return them; the lifecycle calls this a few times per lease, so an offline worker is
        noticed within about a lease even while a round blocks."""
        now = self._clock()
        with self._lock:
            gone = [w for w in self._workers if w not in self._offline and not self._alive(w, now)]
            for w in gone:
                self._offline.add(w)
                metrics.WORKER_OFFLINE.labels(w).inc()
                age = now - self._last_seen[w]
                why = f"no heartbeat for {age:.1f} s" if math.isfinite(age) else "unreachable"
                logger.info("worker %s is offline: %s", w, why)
            self._publish()
        return gone

    def unreachable(self, worker_id: str) -> None:
        """A worker refused a connection (UNAVAILABLE): end its lease now instead of letting
        it lose rounds until the lease runs out; its next heartbeat brings it back."""
        with self._lock:
            if worker_id in self._last_seen:
                self._last_seen[worker_id] = -math.inf
        self.sweep()

    def _publish(self) -> None:
        """The alive gauge, under the lock."""
        now = self._clock()
        metrics.WORKERS_ALIVE.set(sum(self._alive(w, now) for w in self._workers))

    def is_alive(self, worker_id: str) -> bool:
        with self._lock:
            return self._alive(worker_id, self._clock())

    def available(self) -> NDArray[np.bool_]:
        """Per site: hosted by a worker that is ready and alive now (the lease, not the last
        sweep, decides, so a worker that beat again is usable at once)."""
        now = self._clock()
        mask = np.zeros(self.num_sites, dtype=bool)
        with self._lock:
            for w in self._workers.values():
                if w.ready and self._alive(w.worker_id, now):
                    mask[list(w.sites)] = True
        return mask

    def offline_sites(self) -> list[int]:
        """Registered sites whose worker is not alive (or not ready), ascending."""
        with self._lock:
            hosted = sorted(self._site_owner)
        mask = self.available()
        return [s for s in hosted if not mask[s]]

    @property
    def site_count(self) -> int:
        """Sites of workers that are ready to train (a run waits for these)."""
        with self._lock:
            return sum(len(w.sites) for w in self._workers.values() if w.ready)

    def owner(self, site: int) -> Worker | None:
        with self._lock:
            wid = self._site_owner.get(site)
            return self._workers.get(wid) if wid is not None else None

    def group(self, sites: Sequence[int]) -> tuple[dict[str, list[int]], list[int]]:
        """({worker id: its sites, in the given order}, sites no worker hosts)."""
        groups: dict[str, list[int]] = {}
        orphans: list[int] = []
        with self._lock:
            for s in sites:
                wid = self._site_owner.get(int(s))
                if wid is None:
                    orphans.append(int(s))
                else:
                    groups.setdefault(wid, []).append(int(s))
        return groups, orphans

    def worker(self, worker_id: str) -> Worker:
        with self._lock:
            w = self._workers.get(worker_id)
        if w is None:
            raise NotFound(f"worker {worker_id!r} is not registered")
        return w


class LivenessLog:
    """What the leases mean for PowerTrip mode's rounds: each round's availability mask, the
    rounds that had sites down (kept in checkpoints, so a restarted run replays its rounds with
    the masks they had and its policy selects as before), and the wait when no site is alive."""

    def __init__(
        self,
        registry: WorkerRegistry,
        stop: threading.Event,
        wait_s: float,
        down: dict[int, list[int]] | None = None,
    ) -> None:
        self.registry = registry
        self._stop = stop
        self.wait_s = wait_s
        self.down: dict[int, list[int]] = dict(down or {})  # round -> unavailable sites

    def wait_for_a_site(self) -> None:
        """With no site alive, wait up to one round deadline for a worker to beat again before
        the round fails: a brief outage of every worker then costs a deadline, not the run."""
        if self.registry.available().any():
            return
        logger.warning("no worker is alive: waiting up to %g s for one", self.wait_s)
        end = time.monotonic() + self.wait_s
        while not self._stop.wait(0.1):
            if self.registry.available().any() or time.monotonic() >= end:
                return

    def mask(self, round_index: int, profile: SiteProfile, replaying: bool) -> SiteProfile:
        """``profile`` with round ``round_index``'s availability; unchanged (no mask, so the run
        equals the emulator) while every site is available."""
        if replaying:
            gone = self.down.get(round_index)
        else:
            available = self.registry.available()
            gone = None if available.all() else [int(s) for s in np.flatnonzero(~available)]
            if gone is not None:
                self.down[round_index] = gone
        if gone is None:
            return profile
        available = np.ones(profile.size, dtype=bool)
        available[gone] = False
        return replace(profile, available=available)

    def to_state(self) -> dict[str, object]:
        return {"unavailable": {str(r): sites for r, sites in self.down.items()}}

    @staticmethod
    def from_state(state: dict[str, object]) -> dict[int, list[int]]:
        """The masks a checkpoint recorded; TypeError or ValueError when malformed."""
        raw = state.get("unavailable", {})
        if not isinstance(raw, dict):
            raise TypeError("unavailable is not a mapping")
        return {int(r): [int(s) for s in sites] for r, sites in raw.items()}
