"""Which sites each worker identity may host: the operator's map, instead of first-come.

Without it, the first worker to claim a site keeps it: any holder of a certificate from the CA
can register another worker's sites before that worker starts, and the rightful one is refused.
``POWERTRIP_SITE_OWNERS="w0=0-3;w1=4-7"`` (or ``POWERTRIP_SITE_OWNERS_FILE``, one
``w0: 0-3`` per line, re-read on change) binds sites to identities: a claim of a site not
assigned to the claimant is refused, whoever registered first. The map also admits only the
workers it names (docs/site-ownership.md). Site lists use ``parse_site_list``'s syntax.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from powertrip.services.common.allow_list import WatchedFile
from powertrip.services.common.identity import SERVICES, id_problem
from powertrip.sites.profiles import parse_site_list, site_id

logger = logging.getLogger(__name__)
VARIABLE = "POWERTRIP_SITE_OWNERS"
#: worker id -> the sites it may host
Owners = dict[str, frozenset[int]]


def site_names(sites: Iterable[int]) -> str:
    """Sites as a short line: consecutive runs collapse ("site-000..site-003, site-007")."""
    runs: list[list[int]] = []
    for s in sorted(set(sites)):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(site_id(a) if a == b else f"{site_id(a)}..{site_id(b)}" for a, b in runs)


def _build(entries: Iterable[tuple[str, str, str]], num_sites: int | None) -> Owners:
    """(where, worker id, site spec) entries -> the map; ValueError naming the bad entry."""
    owners: Owners = {}
    holder: dict[int, str] = {}
    for where, worker, spec in entries:
        problem = id_problem(worker)
        if problem:
            raise ValueError(f"{where}: {problem}")
        if worker in SERVICES:
            raise ValueError(f"{where}: the {worker} identity cannot host sites")
        if worker in owners:
            raise ValueError(f"{where}: worker {worker!r} already has an entry")
        try:
            sites = frozenset(parse_site_list(spec))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        taken = sorted(s for s in sites if s in holder)
        if taken:
            raise ValueError(
                f"{where}: {site_names(taken)} already assigned to {holder[taken[0]]!r}"
            )
        if num_sites is not None:
            outside = [s for s in sites if s >= num_sites]
            if outside:
                raise ValueError(
                    f"{where}: {site_names(outside)} not in this run "
                    f"({num_sites} sites, {site_names(range(num_sites))})"
                )
        owners[worker] = sites
        holder.update(dict.fromkeys(sites, worker))
    return owners


def _entries(lines: list[tuple[str, str]], sep: str, example: str) -> list[tuple[str, str, str]]:
    """(where, worker id, sites) of each non-empty ``(where, text)``; ValueError naming the
    place when the separator is missing."""
    entries = []
    for where, text in lines:
        if not text:
            continue
        worker, found, sites = text.partition(sep)
        if not found:
            raise ValueError(f"{where}: expected {example}")
        entries.append((where, worker.strip(), sites))
    return entries


def parse_owners(spec: str, num_sites: int | None = None) -> Owners:
    """``"w0=0-3;w1=4-7"`` -> the map; ValueError naming the variable and the bad entry."""
    parts = [p.strip() for p in spec.split(";")]
    entries = _entries(
        [(f"{VARIABLE} entry {p!r}", p) for p in parts], "=", "WORKER_ID=SITES, e.g. w0=0-3"
    )
    if not entries:
        raise ValueError(f"{VARIABLE}={spec!r}: no WORKER_ID=SITES entry")
    return _build(entries, num_sites)


def read_owners(path: str | Path, num_sites: int | None = None) -> Owners:
    """The file's map (``WORKER_ID: SITES`` per line, ``#`` comments); ValueError naming the file
    and the line."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"site owners file {str(path)!r} unreadable: {exc}") from None
    lines = [
        (f"site owners file {str(path)!r} line {n}", raw.split("#", 1)[0].strip())
        for n, raw in enumerate(text.splitlines(), 1)
    ]
    entries = _entries(lines, ":", "'WORKER_ID: SITES', e.g. 'w0: 0-3'")
    if not entries:
        raise ValueError(f"site owners file {str(path)!r}: no 'WORKER_ID: SITES' line")
    return _build(entries, num_sites)


class SiteOwners:
    """The map RegisterWorker consults; inactive (first-come) when neither form is set."""

    def __init__(
        self,
        spec: str | None = None,
        path: str | None = None,
        num_sites: int | None = None,
        check_every_s: float = 1.0,
    ) -> None:
        if spec and path:
            raise ValueError(f"set {VARIABLE} or {VARIABLE}_FILE, not both")
        self._static = parse_owners(spec, num_sites) if spec else None
        self._file: WatchedFile[Owners] | None = None
        if path:
            self._file = WatchedFile(
                path, lambda p: read_owners(p, num_sites), check_every_s, self._changed
            )
        self._ever = frozenset(self.owners() or ())  # ids once on the map: gone is "revoked"

    def _changed(self, old: Owners, new: Owners) -> None:
        moved = sorted(w for w in old.keys() | new.keys() if old.get(w) != new.get(w))
        shown = "; ".join(f"{w}={site_names(new.get(w, ())) or '-'}" for w in moved)
        logger.warning("site owners file re-read: %s", shown)
        self._ever = self._ever | frozenset(new)

    @property
    def active(self) -> bool:
        return self._static is not None or self._file is not None

    def owners(self) -> Owners | None:
        """The current map (the file re-read if it changed); None when first-come."""
        if self._file is not None:
            return self._file.value()
        return self._static

    def verdict(self, worker_id: str) -> str | None:
        """As ``AllowList.verdict``: the map admits the workers it names."""
        owners = self.owners()
        if owners is None or worker_id in owners:
            return None
        return "revoked" if worker_id in self._ever else "not_allowed"

    def refusal(self, worker_id: str, sites: Sequence[int]) -> str | None:
        """One line naming the claimed sites ``worker_id`` may not host and whose they are;
        None when every one is assigned to it (or the map is off)."""
        owners = self.owners()
        if owners is None:
            return None
        mine = owners.get(worker_id, frozenset())
        others: dict[str, list[int]] = {}
        for s in sorted(set(sites) - mine):
            holder = next((w for w, ss in owners.items() if s in ss), None)
            others.setdefault(holder or "", []).append(s)
        if not others:
            return None
        parts = [
            f"{site_names(ss)}: "
            + (f"assigned to {holder!r}" if holder else "not assigned to any worker")
            for holder, ss in others.items()
        ]
        return f"worker {worker_id!r} may not host " + "; ".join(parts)
