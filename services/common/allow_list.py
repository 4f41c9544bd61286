"""The worker allow-list: a static set plus a file re-read when it changes (live revocation).

POWERTRIP_ALLOWED_WORKERS ("w0,w1") is fixed for the life of the process;
POWERTRIP_ALLOWED_WORKERS_FILE (one id per line, ``#`` starts a comment) is re-read when its
mtime or size changes, checked with one ``stat`` at most every ``check_every_s`` (1 s). A worker
is admitted if either names it. Removing an id from the file therefore takes effect on that
worker's next call (heartbeat, update, status) without a restart; an id in the static list can
only be removed by a restart.

A file that becomes bad (unreadable, an invalid id on line N) keeps the last good list and logs
one line naming the file and the line; at start a bad file is a configuration error instead.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Collection
from pathlib import Path

from services.common.identity import id_problem

logger = logging.getLogger(__name__)


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
        self.check_every_s = check_every_s
        self._lock = threading.Lock()
        self._ids: frozenset[str] = frozenset()
        self._sig: tuple[int, int] | None = None
        self._next_check = 0.0
        self._ever: set[str] = set()  # ids admitted at some point: their removal is "revoked"
        if path is not None:
            self._sig = _signature(path)
            self._ids = read_ids(path)  # at start a bad file is an error, not a warning
            self._ever |= self._ids
            self._next_check = time.monotonic() + check_every_s
        if self.static:
            self._ever |= self.static

    @property
    def active(self) -> bool:
        return self.static is not None or self.path is not None

    def _refresh(self) -> None:
        now = time.monotonic()
        if self.path is None or now < self._next_check:
            return
        self._next_check = now + self.check_every_s
        sig = _signature(self.path)
        if sig == self._sig:
            return
        self._sig = sig  # a bad version is reported once, not on every check
        try:
            ids = read_ids(self.path)
        except ValueError as exc:
            logger.error("%s; keeping the previous list of %d ids", exc, len(self._ids))
            return
        removed = self._ids - ids
        if removed:
            logger.warning("allow-list %s: revoked %s", self.path, ", ".join(sorted(removed)))
        self._ids = ids
        self._ever |= ids

    def verdict(self, worker_id: str) -> str | None:
        if not self.active:
            return None
        with self._lock:
            self._refresh()
            if (self.static and worker_id in self.static) or worker_id in self._ids:
                return None
            return "revoked" if worker_id in self._ever else "not_allowed"

    __call__ = verdict
