"""Which worker hosts which site, and where to reach it."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from powertrip.sites import site_id
from services.common.errors import BadRequest, Duplicate, NotFound


@dataclass(frozen=True)
class Worker:
    worker_id: str
    address: str
    sites: tuple[int, ...]
    ready: bool = True  # sites loaded: can train when a round starts


class WorkerRegistry:
    def __init__(self, num_sites: int) -> None:
        self.num_sites = num_sites
        self._workers: dict[str, Worker] = {}
        self._site_owner: dict[int, str] = {}
        self._lock = threading.Lock()

    def register(
        self, worker_id: str, address: str, sites: Sequence[int], ready: bool = True
    ) -> tuple[Worker, bool]:
        """Add or replace a worker (a restarted worker re-registers under its id).

        Returns (worker, changed): workers re-register periodically as a heartbeat, so that an
        aggregator restarted from a checkpoint finds them again; ``changed`` is False for those.
        """
        if not worker_id or not address:
            raise BadRequest("registration needs worker_id and address")
        if not sites:
            raise BadRequest(f"worker {worker_id!r} registered no site")
        outside = [site_id(s) for s in sites if not 0 <= s < self.num_sites]
        if outside:
            raise NotFound(f"sites {outside} are not in this run ({self.num_sites} sites)")
        with self._lock:
            for s in sites:
                owner = self._site_owner.get(s)
                if owner is not None and owner != worker_id:
                    raise Duplicate(f"{site_id(s)} is already hosted by worker {owner!r}")
            old = self._workers.get(worker_id)
            worker = Worker(worker_id, address, tuple(sorted(set(sites))), ready)
            if old == worker:
                return old, False
            if old is not None:
                for s in old.sites:
                    self._site_owner.pop(s, None)
            self._workers[worker_id] = worker
            for s in worker.sites:
                self._site_owner[s] = worker_id
            return worker, True

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
