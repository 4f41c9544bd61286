"""CSV plumbing shared by the power and carbon readers: one error type whose message points at
file, line and column, and field parsers that refuse what a trace must never contain."""

from __future__ import annotations

import csv
import gzip
import math
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

TRUE_WORDS = frozenset({"true", "1"})
FALSE_WORDS = frozenset({"false", "0"})


class TraceError(ValueError):
    """A trace file that cannot be trusted; ``str()`` is one line naming file, line and column."""

    def __init__(
        self, path: Path | str, message: str, line: int | None = None, column: str | None = None
    ) -> None:
        self.path = str(path)
        self.line = line
        self.column = column
        self.reason = message
        where = self.path
        if line is not None:
            where += f", line {line}"
        if column is not None:
            where += f", column {column!r}"
        super().__init__(f"{where}: {message}")


def _open_text(path: Path):  # noqa: ANN202 - a text stream
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


def read_header(path: Path) -> list[str]:
    """The stripped header fields (for format detection); an unreadable or empty file raises."""
    for _, fields in csv_rows(path):
        return fields
    raise AssertionError("unreachable: csv_rows raises on an empty file")


def csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(physical line number, stripped fields) of every non-blank row, header first.

    Handles CRLF and LF, a missing final newline, gzip and a UTF-8 BOM. Raises TraceError for a
    missing, empty, undecodable or truncated (gzip) file, and for a header without data rows.
    """
    if not path.is_file():
        raise TraceError(path, "no such file")
    line = 0
    rows = 0
    try:
        with _open_text(path) as f:
            reader = csv.reader(f)
            for fields in reader:
                line = reader.line_num
                if not fields or all(not x.strip() for x in fields):
                    continue
                rows += 1
                yield line, [x.strip() for x in fields]
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceError(path, f"truncated or corrupt gzip data ({exc})", line + 1) from None
    except UnicodeDecodeError:
        raise TraceError(path, "not UTF-8 text", line + 1) from None
    except csv.Error as exc:
        raise TraceError(path, f"malformed CSV ({exc})", line + 1) from None
    if rows == 0:
        raise TraceError(path, "empty file (no header)", 1)
    if rows == 1:
        raise TraceError(path, "header only, no data rows", line + 1)


def check_width(path: Path, line: int, fields: list[str], header: list[str]) -> None:
    if len(fields) != len(header):
        raise TraceError(
            path,
            f"expected {len(header)} fields as in the header, got {len(fields)} "
            "(truncated or malformed line)",
            line,
        )


def parse_number(path: Path, line: int, column: str, text: str) -> float:
    """A finite float; empty, non-numeric, NaN and infinite values are errors."""
    if not text:
        raise TraceError(path, "missing value", line, column)
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, f"not a number: {text!r}", line, column) from None
    if math.isnan(value):
        raise TraceError(path, "NaN is not allowed", line, column)
    if math.isinf(value):
        raise TraceError(path, f"not finite: {text!r}", line, column)
    return value


def parse_bool(path: Path, line: int, column: str, text: str) -> bool:
    word = text.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise TraceError(path, f"not a boolean (true/false): {text!r}", line, column)


def parse_timestamp(path: Path, line: int, column: str, text: str) -> datetime:
    """An ISO-8601 timestamp; naive ones are taken as UTC (as WattTime/Vessim exports are)."""
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise TraceError(path, f"not an ISO timestamp: {text!r}", line, column) from None
    return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)


def ar1(first: float, shocks: np.ndarray, coef: float) -> np.ndarray:
    """x[0] = first, x[k] = coef * x[k-1] + shocks[k]: the AR(1) noise of the synthetic traces
    (callers draw ``first`` and ``shocks`` so each keeps its own random stream)."""
    noise = np.empty(shocks.size)
    noise[0] = first
    for k in range(1, shocks.size):
        noise[k] = coef * noise[k - 1] + shocks[k]
    return noise
