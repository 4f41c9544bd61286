"""The round journal on disk: the run's history, one self-checking, hash-chained line per round,
appended beside the checkpoints. History only: no checkpoint refers to it and nothing resumes
from it (a checkpoint holds every state a resume needs), so damage costs history, never a round.

Line i (from 1) is the canonical JSON ``{"entry": ..., "n": i, "prev": P, "sha256": H}``, with
H the SHA-256 of the canonical JSON of ``{"entry", "n", "prev"}`` and P line i-1's H (line 1's:
64 zeros). A changed digit, an inserted or deleted byte anywhere in a line fails that line's own
check (its bytes are not the canonical text of its content, or H does not match), so the report
names the line that was damaged, the last one included; a deleted or reordered line fails the
chain. ``recover`` reads the journal at start: the intact lines up to the resumed checkpoint's
round are the history; from the first damaged line on, the file is quarantined (renamed aside
whole, ``journal.jsonl.damaged-N``, and the intact prefix written back), reported in one line
and counted (``powertrip_journal_damaged_total{reason}``). A missing file, or one that ends
before the checkpoint's round, is reported the same way. Lines past the checkpoint's round (a
crash between the append and the manifest's commit, the rounds of a rejected newer checkpoint)
are rounds the resumed run redoes: cut off by the first append, not damage.

Why a hash-chained JSON-lines file and not SQLite (stdlib ``sqlite3``, WAL), the usual choice for
a queryable embedded history: SQLite keeps no checksum of a record's bytes (only with the
``cksumvfs`` extension, not in the standard library), so a changed digit in a stored round would
be read back as the truth, unreported; the R34 attacks (a digit changed, the file cut or
deleted, a byte inserted) are each detected here at the exact line. The history's queries are
few (the status pages rounds by number from memory, plots read every round once), an append is
one ``pwrite`` and one fsync, and the file reads with ``jq`` or a text editor.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powertrip.rounds.journal import JournalEntry
from powertrip.services.aggregator import metrics
from powertrip.services.aggregator.durable_files import commit_rename, fsync_dir, write_temp

logger = logging.getLogger(__name__)
NAME = "journal.jsonl"
GENESIS = "0" * 64
#: the values of ``powertrip_journal_damaged_total``'s ``reason`` label
REASONS = ("missing", "cut", "edited", "unreadable")
for _reason in REASONS:  # every series exported from the start, at 0
    metrics.JOURNAL_DAMAGED.labels(_reason)


@dataclass(frozen=True)
class JournalRef:
    """The journal's intact prefix: how many lines, their length in bytes, the last line's
    hash (what the next line chains to)."""

    entries: int
    bytes: int
    sha256: str


EMPTY = JournalRef(0, 0, GENESIS)


def _body_sha(entry: Mapping[str, Any], n: int, prev: str) -> str:
    body = json.dumps({"entry": entry, "n": n, "prev": prev}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def _line(n: int, prev: str, entry: Mapping[str, Any]) -> tuple[bytes, str]:
    """Line ``n`` and its hash."""
    sha = _body_sha(entry, n, prev)
    line = {"entry": entry, "n": n, "prev": prev, "sha256": sha}
    return json.dumps(line, sort_keys=True, separators=(",", ":")).encode() + b"\n", sha


@dataclass(frozen=True)
class Recovery:
    """What ``recover`` found: the history (rounds up to the checkpoint's), the writer that
    appends after it, and the one-line report of damage (None: intact)."""

    entries: list[JournalEntry]
    writer: JournalFile
    damage: str | None = None


def _check(raw: bytes, n: int, prev: str, last_round: int) -> tuple[JournalEntry, str] | str:
    """Line ``n``'s entry and hash, or why it is damaged (a short phrase)."""
    try:
        line = json.loads(raw)
    except (ValueError, RecursionError):
        return "is not JSON"
    if not isinstance(line, dict) or set(line) != {"entry", "n", "prev", "sha256"}:
        return "is not a journal line {entry, n, prev, sha256}"
    if not isinstance(line["entry"], dict) or not isinstance(line["sha256"], str):
        return "is not a journal line {entry, n, prev, sha256}"
    try:
        canonical, sha = _line(line["n"], line["prev"], line["entry"])
    except (TypeError, ValueError):
        return "is not a journal line {entry, n, prev, sha256}"
    if sha != line["sha256"] or canonical != raw + b"\n":
        return "does not match its own SHA-256 (edited)"
    if line["n"] != n or line["prev"] != prev:
        return f"does not chain to line {n - 1} (a line deleted, moved or inserted)"
    try:
        entry = JournalEntry.from_json(line["entry"], f"{NAME} line {n}")
    except TypeError as exc:
        return f"is not a round entry ({exc})"
    if entry.round <= last_round:
        return f"repeats round {entry.round}"
    return entry, sha


def recover(directory: Path, upto_round: int) -> Recovery:
    """The history of a run resumed after round ``upto_round`` (0: a fresh start), the damaged
    part quarantined and reported (one warning, one count); never raises for the journal's
    content (an OSError of the directory itself still does)."""
    path = directory / NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if upto_round == 0:
            return Recovery([], JournalFile(directory))
        why = f"{NAME} is missing: the history of rounds 1..{upto_round} is lost"
        return Recovery([], JournalFile(directory), _report("missing", why, None, upto_round))
    except OSError as exc:
        aside = _set_aside(path)
        why = f"{NAME} is unreadable ({exc.strerror or exc})"
        return Recovery([], JournalFile(directory), _report("unreadable", why, aside, upto_round))
    entries: list[JournalEntry] = []
    prev, offset, n, last_round = GENESIS, 0, 0, 0
    problem: tuple[str, str] | None = None  # (reason, why)
    while offset < len(data):
        end = data.find(b"\n", offset)
        if end < 0:  # no newline: the file ends inside this line
            if last_round < upto_round:
                problem = ("cut", f"{NAME} ends inside line {n + 1} (the file was cut)")
            break
        checked = _check(data[offset:end], n + 1, prev, last_round)
        if isinstance(checked, str):
            problem = ("edited", f"{NAME} line {n + 1} {checked}")
            break
        entry, sha = checked
        if entry.round > upto_round:
            break  # a round the resumed run redoes: the next append cuts it off
        entries.append(entry)
        prev, offset, n, last_round = sha, end + 1, n + 1, entry.round
    writer = JournalFile(directory, JournalRef(n, offset, prev))
    if problem is None and last_round < upto_round:
        after = f"after round {last_round}" if entries else "before round 1"
        problem = (
            "cut",
            f"{NAME} ends {after}, the checkpoint is at round {upto_round} (the file was cut, "
            "or an append failed): the history of the rounds between is lost",
        )
    if problem is None:
        return Recovery(entries, writer)
    quarantined = None
    if offset < len(data):  # damaged bytes: the whole file aside, the intact prefix back
        quarantined = _set_aside(path)
        commit_rename(write_temp(path, lambda f: f.write(data[:offset])), path)
        fsync_dir(directory)
    return Recovery(entries, writer, _report(*problem, quarantined, upto_round))


def _set_aside(path: Path) -> Path:
    """Rename ``path`` to the first free ``<name>.damaged-N``; the new name."""
    i = 1
    while (aside := path.with_name(f"{path.name}.damaged-{i}")).exists():
        i += 1
    os.replace(path, aside)
    fsync_dir(path.parent)
    return aside


def _report(reason: str, why: str, aside: Path | None, upto_round: int) -> str:
    metrics.JOURNAL_DAMAGED.labels(reason).inc()
    kept = f"; quarantined as {aside.name}" if aside is not None else ""
    line = (
        f"round journal damaged: {why}{kept}; no checkpoint is affected, the run resumes from "
        f"round {upto_round}"
    )
    logger.warning("%s", line)
    return line


class JournalFile:
    """The writer: entries staged by ``extend`` are appended and fsynced by ``sync``. One
    writer per directory (as for the checkpoints). The file is cut to the intact prefix before
    every append, so lines a crash or a failed append left past it never precede new ones; a
    failed ``sync`` keeps the entries staged for the next."""

    def __init__(self, directory: Path, ref: JournalRef = EMPTY) -> None:
        self.directory = directory
        self.path = directory / NAME
        self.ref = ref
        self._staged: list[Mapping[str, Any]] = []

    def extend(self, entries: Iterable[Mapping[str, Any]]) -> None:
        self._staged.extend(entries)

    def sync(self) -> JournalRef:
        """Append the staged entries and fsync; the reference to the new prefix (OSError: the
        file is as before, up to bytes the next ``sync`` cuts off)."""
        if not self._staged:
            return self.ref
        ref, prev, lines = self.ref, self.ref.sha256, []
        for n, entry in enumerate(self._staged, start=ref.entries + 1):
            line, prev = _line(n, prev, entry)
            lines.append(line)
        blob = b"".join(lines)
        self.directory.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, ref.bytes)
            if os.pwrite(fd, blob, ref.bytes) != len(blob):
                raise OSError(f"short write to {self.path}")
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_dir(self.directory)  # the new file's name is in the directory
        self.ref = JournalRef(ref.entries + len(lines), ref.bytes + len(blob), prev)
        self._staged.clear()
        return self.ref

    def sync_or_report(self) -> bool:
        """``sync``; a disk that refuses it costs a warning and a count, never the checkpoint
        being written (the entries stay staged for the next round's append)."""
        try:
            self.sync()
        except OSError as exc:
            metrics.JOURNAL_WRITE_FAILURES.inc()
            logger.warning(
                "round journal not appended (retried with the next round): %s: %s",
                type(exc).__name__,
                " ".join(str(exc).split()),
            )
            return False
        return True
