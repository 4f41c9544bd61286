"""A study's record of its finished runs (``runs.jsonl`` in its output folder), kept as each run
finishes so that a crash costs only the run in progress and a later process can continue the
study (``powertrip experiment --resume``, ``powertrip curtail --resume``).

The first line names the study and holds its configuration; each further line is one finished
run, under a key the study chooses, with every number its outputs are written from (floats as
JSON writes them: exact). A line is appended whole with one write and made durable (fsync)
before the study goes on; a line a crash tore (the file does not end in a newline) is dropped
when the record is opened again. ``{"complete": true}`` is the last line once every output of
the study is written.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

RECORD = "runs.jsonl"
FORMAT = 1


class RecordError(ValueError):
    """The record cannot be continued: one line saying where and why."""


class RecordExists(RecordError):
    """The folder holds a study's record and the caller did not ask to continue it."""


class StudyRecord:
    """The runs a study has recorded (``get``) and the way it records the next (``add``)."""

    def __init__(
        self,
        path: Path,
        runs: dict[str, dict[str, Any]],
        complete: bool,
        header: dict[str, Any] | None = None,
    ) -> None:
        self.path = path
        self._runs = runs
        self.complete = complete
        #: a new record's first line, written with its first run (a study that fails before
        #: finishing one leaves nothing behind)
        self._header = header
        #: how the process that started the record ran the study (``open``'s ``execution``)
        self.execution: dict[str, Any] = {} if header is None else header["execution"]
        #: the record file, open and locked while this process may write it
        self._lock: BinaryIO | None = None

    @property
    def created(self) -> bool:
        """True when this process starts the record (there was nothing to resume)."""
        return self._header is not None or (not self._runs and not self.complete)

    @classmethod
    def open(
        cls,
        out_dir: Path,
        study: str,
        config: Mapping[str, Any],
        resume: bool,
        execution: Mapping[str, Any] | None = None,
    ) -> StudyRecord:
        """The record of ``study`` (its kind, e.g. "ExperimentConfig") with ``config`` (its
        JSON dump) in ``out_dir``: a new one when the folder holds none (or one of no run,
        which this one replaces); the one there when ``resume``. RecordError when the folder
        holds a record and ``resume`` is off, or when the record there is another kind of
        study, another configuration or damaged. ``execution``: how this process runs it
        (threads, device: not the study's identity, but floats can differ in their last digits
        between them), kept in the header as ``execution``."""
        path = out_dir / RECORD
        lock = _locked(path) if path.exists() else None
        if lock is not None and _empty(path):  # a study that ended before its first run
            path.unlink()
            lock.close()
        if not path.exists():
            header = {"study": study, "format": FORMAT, "config": dict(config)}
            return cls(path, {}, False, header | {"execution": dict(execution or {})})
        assert lock is not None
        try:
            return cls._continued(path, study, config, resume, lock)
        except BaseException:
            lock.close()
            raise

    @classmethod
    def _continued(
        cls,
        path: Path,
        study: str,
        config: Mapping[str, Any],
        resume: bool,
        lock: BinaryIO,
    ) -> StudyRecord:
        if not resume:
            raise RecordExists(f"holds a study already ({RECORD})")
        header, runs, complete, good = _read(path)
        if header.get("study") != study or header.get("format") != FORMAT:
            raise RecordError(
                f"{path}: a record of {header.get('study')!r} (format {header.get('format')}), "
                f"not of {study!r} (format {FORMAT})"
            )
        differ = config_differences(header.get("config"), config)
        if differ:
            raise RecordError(f"holds a study of another configuration: {'; '.join(differ)}")
        if good < path.stat().st_size:  # a line torn by the crash: never read, so cut off
            with path.open("r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())
        record = cls(path, runs, complete)
        ran = header.get("execution")
        record.execution = dict(ran) if isinstance(ran, dict) else {}
        record._lock = lock
        return record

    def close(self) -> None:
        """Let another process continue the record (the end of this one does too)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __len__(self) -> int:
        return len(self._runs)

    def get(self, key: str) -> dict[str, Any] | None:
        """What ``add`` recorded under ``key``, or None."""
        return self._runs.get(key)

    def add(self, key: str, run: Mapping[str, Any]) -> None:
        """Record a finished run (JSON values) durably before the study goes on."""
        if key in self._runs:
            raise RecordError(f"{self.path}: run {key!r} is recorded already")
        entry = {"run": key, **run}
        self._begin()
        append_durably(self.path, _line(entry))
        self._runs[key] = entry

    def finish(self) -> None:
        """Mark the study complete: every run recorded and every output written."""
        if not self.complete:
            self._begin()
            append_durably(self.path, _line({"complete": True}))
            self.complete = True

    def _begin(self) -> None:
        if self._header is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                _create(self.path, _line(self._header))
            except FileExistsError:
                raise RecordError(
                    f"{self.path}: another process began a study in this folder meanwhile"
                ) from None
            self._lock = _locked(self.path)
            self._header = None


def config_differences(recorded: object, config: Mapping[str, Any]) -> list[str]:
    """Each setting that differs between a recorded configuration and ``config``, as
    ``name <recorded> there, <now> now`` (nested settings by dotted name), in the
    configuration's order."""
    old = _flat(recorded) if isinstance(recorded, Mapping) else {}
    new = _flat(config)
    missing = object()
    out = []
    for name in [*new, *(k for k in old if k not in new)]:
        a, b = old.get(name, missing), new.get(name, missing)
        if a != b:
            shown = [("(unset)" if v is missing else json.dumps(v)) for v in (a, b)]
            out.append(f"{name} {shown[0]} there, {shown[1]} now")
    return out


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def _locked(path: Path) -> BinaryIO:
    """``path`` open with an exclusive lock held (released when closed, or when the process
    ends however it ends); RecordError when another process holds it."""
    f = path.open("rb")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise RecordError(
            f"is in use: another process is running the study there ({RECORD} is locked)"
        ) from None
    return f


def _empty(path: Path) -> bool:
    """A record of no run (its header line at most): nothing a resume would keep."""
    with path.open("rb") as f:
        return f.read().count(b"\n") <= 1


def _line(value: Mapping[str, Any]) -> bytes:
    return (json.dumps(value, separators=(",", ":")) + "\n").encode()


def _read(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], bool, int]:
    """(header, runs by key, complete, bytes of whole lines)."""
    data = path.read_bytes()
    good = data.rfind(b"\n") + 1  # bytes after the last newline: a torn line
    header: dict[str, Any] | None = None
    runs: dict[str, dict[str, Any]] = {}
    complete = False
    for n, raw in enumerate(data[:good].splitlines(), start=1):
        try:
            entry = json.loads(raw)
        except ValueError as exc:
            raise RecordError(f"{path} line {n} is not JSON ({exc})") from None
        if not isinstance(entry, dict):
            raise RecordError(f"{path} line {n} is not a JSON object")
        if header is None:
            header = entry
        elif entry.get("complete") is True:
            complete = True
        elif isinstance(entry.get("run"), str):
            runs[entry["run"]] = entry
        else:
            raise RecordError(f"{path} line {n} is neither a run nor the end of the study")
    if header is None:
        raise RecordError(f"{path} has no header line (a study's record starts with one)")
    return header, runs, complete, good


def _create(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    _sync_folder(path.parent)


def append_durably(path: Path, data: bytes) -> None:
    """Append ``data`` with one write (a whole line or, should the process die inside the call,
    a torn tail the readers drop) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sync_folder(folder: Path) -> None:
    """Make a new file's name durable too (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def csv_bytes(rows: Iterable[Sequence[object]]) -> bytes:
    """Rows as ``csv.writer`` writes them (``files.write_csv``'s format), so a table appended to
    as the study goes reads like the one written at its end."""
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(rows)
    return buf.getvalue().encode()


def start_table(path: Path, header: Sequence[str]) -> None:
    """(Re)start a table the study appends to (``append_rows``): its header line only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, csv_bytes([header]))
        os.fsync(fd)
    finally:
        os.close(fd)


def append_rows(path: Path, rows: Iterable[Sequence[object]]) -> None:
    """A finished run's rows of a table, appended whole and fsync'd."""
    data = csv_bytes(rows)
    if data:
        append_durably(path, data)
