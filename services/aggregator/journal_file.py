"""The round journal on disk: one hash-chained line per round, appended beside the checkpoints.

Why a file of its own: a restarted run replays every round (exact resume), so the journal grows
with the run. Embedded in each manifest it made every checkpoint O(rounds) to write and fsync
(859 KB after 1,818 rounds). Here a round costs one appended line and one fsync, and a manifest
holds a reference of constant size, ``JournalRef``: how many lines it covers, their length in
bytes, and the SHA-256 of the last one.

Line i (from 1; in PowerTrip mode line i is round i) is the canonical JSON
``{"entry": ..., "n": i, "prev": <SHA-256 of line i-1>}`` (line 1's ``prev``: 64 zeros), so
the hash in a manifest covers every line before it, and a line that does not chain names
where the file was edited. The kept fallback checkpoint references a shorter prefix of the
same file. Whatever lies past a manifest's prefix (a crash between the append and the
manifest's commit, a failed append, the rounds of a rejected newer checkpoint) is ignored at
load and cut off by the first append after the resume (``JournalFile``). Segment files sealed
every N rounds would bound each file too, but add a second commit protocol for nothing: the
replay reads the whole history at every start either way.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powertrip.services.aggregator.durable_files import fsync_dir

NAME = "journal.jsonl"
GENESIS = "0" * 64
_HEX = frozenset("0123456789abcdef")


class JournalError(Exception):
    """The journal does not hold what a manifest says: ``reason`` is a checkpoint rejection
    reason (``unreadable``, ``journal-checksum``, ``malformed``), ``path`` the file at fault
    (None: the manifest's reference)."""

    def __init__(self, reason: str, path: Path | None, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.path = reason, path


@dataclass(frozen=True)
class JournalRef:
    """The prefix of the journal file a checkpoint commits to."""

    entries: int
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"entries": self.entries, "bytes": self.bytes, "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: object) -> JournalRef:
        """TypeError or ValueError naming the field that is not as ``to_json`` writes it."""
        if not isinstance(data, dict) or set(data) != {"entries", "bytes", "sha256"}:
            raise TypeError("state.journal is not {entries, bytes, sha256}")
        for key in ("entries", "bytes"):
            if type(data[key]) is not int or data[key] < 0:
                raise TypeError(f"state.journal.{key} is not a count")
        digest = data["sha256"]
        if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
            raise TypeError("state.journal.sha256 is not a SHA-256")
        if (data["entries"] == 0) != (data["bytes"] == 0 and digest == GENESIS):
            raise ValueError("state.journal: entries, bytes and sha256 disagree on emptiness")
        return cls(data["entries"], data["bytes"], digest)


EMPTY = JournalRef(0, 0, GENESIS)


def _line(n: int, prev: str, entry: Mapping[str, Any]) -> bytes:
    body = {"entry": entry, "n": n, "prev": prev}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def resolve(directory: Path, state: Mapping[str, Any]) -> tuple[dict[str, Any], JournalRef]:
    """A manifest's ``state`` with the entries of the prefix its ``journal`` references in
    place of the reference, and the reference; ``JournalError`` naming what does not verify."""
    try:
        ref = JournalRef.from_json(state["journal"])
    except (TypeError, ValueError) as exc:
        raise JournalError("malformed", None, str(exc)) from None
    return {**state, "journal": read(directory, ref)}, ref


def read(directory: Path, ref: JournalRef) -> list[dict[str, Any]]:
    """The entries of the prefix ``ref`` commits to, verified line by line; ``JournalError``
    when the file is missing, shorter, edited or not what the journal writes."""
    if ref.entries == 0:
        return []
    path = directory / NAME
    try:
        with path.open("rb") as f:
            data = f.read(ref.bytes)
    except OSError as exc:
        raise JournalError("unreadable", path, f"{NAME}: {exc}") from None
    if len(data) < ref.bytes or not data.endswith(b"\n"):
        raise JournalError(
            "journal-checksum", path, f"{NAME} is shorter than its {ref.bytes} bytes"
        )
    raws = data.split(b"\n")[:-1]
    if len(raws) != ref.entries:
        raise JournalError(
            "journal-checksum", path, f"{NAME} has {len(raws)} lines, not {ref.entries}"
        )
    links = [hashlib.sha256(raw + b"\n").hexdigest() for raw in raws]
    if links[-1] != ref.sha256:
        raise JournalError(
            "journal-checksum", path, f"{NAME} line {len(raws)} does not match its hash"
        )
    entries, prev = [], GENESIS
    for n, (raw, link) in enumerate(zip(raws, links, strict=True), start=1):
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError):
            raise JournalError("malformed", path, f"{NAME} line {n} is not JSON") from None
        if not isinstance(line, dict) or set(line) != {"entry", "n", "prev"}:
            raise JournalError("malformed", path, f"{NAME} line {n} is not {{entry, n, prev}}")
        if line["prev"] != prev:
            raise JournalError(
                "journal-checksum", path, f"{NAME} line {n} does not chain to line {n - 1}"
            )
        if line["n"] != n or type(line["n"]) is not int:
            raise JournalError("malformed", path, f"{NAME} line {n} is numbered {line['n']!r}")
        entries.append(line["entry"])
        prev = link
    return entries


class JournalFile:
    """The writer: entries staged by ``extend`` are appended and fsynced by ``sync``, whose
    reference the checkpoint's manifest then commits. One writer per directory (as for the
    checkpoints). The file is cut to the committed prefix before every append, so the lines a
    crash or a failed append left past it never precede new ones; a failed ``sync`` keeps the
    entries staged for the next."""

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
            lines.append(_line(n, prev, entry))
            prev = hashlib.sha256(lines[-1]).hexdigest()
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
