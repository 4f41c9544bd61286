"""Google powerdata_2019 power traces (the PowerTrip paper's real-power experiments) and the
PowerSource that replays them.

Reads the upstream schema (``time, cell, pdu, measured_power_util, production_power_util,
bad_measurement_data, bad_production_power_data``; CSV or .csv.gz; ``time`` in microseconds, each
row the start of a 5-minute window) and reduced exports of it (an extra index column, no
``cell``/``pdu``/``production``/flag columns, CRLF): columns are found by name, unknown ones are
ignored.

Flagged rows: a row whose ``bad_*`` flag is True for the chosen utilisation column is counted and
dropped, and its value is not validated (upstream leaves such values empty or meaningless). The
replay reads the latest good window at or before the clock, so a flagged window is bridged by the
last good value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from powertrip.traces.io import (
    TraceError,
    check_width,
    csv_rows,
    parse_bool,
    parse_number,
)

SLOT_S = 300.0  # powerdata_2019 windows are 5 minutes
MEASURED = "measured_power_util"
PRODUCTION = "production_power_util"
#: the flag that marks each utilisation column's value as bad
FLAG_FOR = {MEASURED: "bad_measurement_data", PRODUCTION: "bad_production_power_data"}
COLUMN_ALIASES = {
    "measured": MEASURED,
    "production": PRODUCTION,
    MEASURED: MEASURED,
    PRODUCTION: PRODUCTION,
}
GOOGLE_LABEL = "google-trace"
SYNTHETIC_LABEL = "synthetic-trace"


@dataclass(frozen=True)
class PowerSeries:
    """One power domain (a PDU): the good 5-minute windows of one utilisation column."""

    name: str
    time_s: NDArray[np.float64]  # window starts, seconds on the trace's own clock, increasing
    utilisation: NDArray[np.float64]  # in [0, 1]
    flagged: int = 0  # rows dropped because their bad_* flag was True

    @property
    def spare(self) -> NDArray[np.float64]:
        """Spare power fraction, 1 - utilisation: what a site may use for training."""
        return 1.0 - self.utilisation

    @property
    def rows(self) -> int:
        return int(self.time_s.size) + self.flagged

    def span_s(self, slot_s: float = SLOT_S) -> float:
        """Length of one pass through the series, the period the replay wraps around."""
        return float(self.time_s[-1] - self.time_s[0] + slot_s)


@dataclass(frozen=True)
class PowerTrace:
    """Power domains read from files or generated; ``label`` travels into every output."""

    series: tuple[PowerSeries, ...]
    column: str  # which utilisation column the values are
    label: str  # "google-trace" or "synthetic-trace"
    source: str  # the files read, or a description of the generator
    slot_s: float = SLOT_S
    notes: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.series:
            raise ValueError("a power trace needs at least one series")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.series)


def is_power_header(header: list[str]) -> bool:
    return "time" in header and (MEASURED in header or PRODUCTION in header)


def resolve_column(column: str | None, header: list[str]) -> str:
    """``None`` means production (as the paper uses) where the file has it, else measured."""
    if column is None:
        return PRODUCTION if PRODUCTION in header else MEASURED
    if column not in COLUMN_ALIASES:
        raise ValueError(f"unknown utilisation column {column!r}; use production or measured")
    return COLUMN_ALIASES[column]


def _trace_files(paths: Iterable[Path | str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.name.endswith((".csv", ".csv.gz")))
            if not found:
                raise TraceError(p, "directory holds no .csv or .csv.gz file")
            files.extend(found)
        else:
            files.append(p)
    if not files:
        raise ValueError("no power trace file given")
    return files


def _series_name(path: Path, cell: str | None, pdu: str | None, pdus_in_file: int) -> str:
    if cell is not None and pdu is not None:
        return f"{cell}/{pdu}"
    stem = path.name.removesuffix(".gz").removesuffix(".csv")
    return f"{stem}/{pdu}" if pdu is not None and pdus_in_file > 1 else stem


def read_power_file(path: Path | str, column: str | None = None) -> tuple[list[PowerSeries], str]:
    """The series of one file and the utilisation column read (see ``resolve_column``)."""
    path = Path(path)
    rows = csv_rows(path)
    _, header = next(rows)
    if "time" not in header:
        raise TraceError(path, "not a power trace: the header has no 'time' column", 1)
    col = resolve_column(column, header)
    if col not in header:
        raise TraceError(path, f"the header has no {col!r} column", 1)
    idx = {name: header.index(name) for name in header if name}
    util_cols = [c for c in (MEASURED, PRODUCTION) if c in idx]
    flag_cols = {c: FLAG_FOR[c] for c in util_cols if FLAG_FOR[c] in idx}
    cell_i, pdu_i = idx.get("cell"), idx.get("pdu")

    groups: dict[tuple[str | None, str | None], tuple[list[float], list[float], list[int]]] = {}
    last: dict[tuple[str | None, str | None], tuple[float, int]] = {}
    for line, fields in rows:
        check_width(path, line, fields, header)
        key = (
            fields[cell_i] if cell_i is not None else None,
            fields[pdu_i] if pdu_i is not None else None,
        )
        t_us = parse_number(path, line, "time", fields[idx["time"]])
        if key in last and t_us <= last[key][0]:
            prev_t, prev_line = last[key]
            raise TraceError(
                path,
                f"time {t_us:.0f} is not after {prev_t:.0f} on line {prev_line} "
                "(times must increase within a series)",
                line,
                "time",
            )
        last[key] = (t_us, line)
        bad = {c: parse_bool(path, line, f, fields[idx[f]]) for c, f in flag_cols.items()}
        values = {}
        for c in util_cols:
            if bad.get(c, False):
                continue
            v = parse_number(path, line, c, fields[idx[c]])
            if not 0.0 <= v <= 1.0:
                raise TraceError(path, f"utilisation {v:g} outside [0, 1]", line, c)
            values[c] = v
        times, utils, flagged = groups.setdefault(key, ([], [], [0]))
        if col in values:
            times.append(t_us / 1e6)
            utils.append(values[col])
        else:
            flagged[0] += 1

    pdus = len({k[1] for k in groups})
    series = []
    for (cell, pdu), (times, utils, flagged) in groups.items():
        name = _series_name(path, cell, pdu, pdus)
        if not times:
            raise TraceError(path, f"every row of series {name!r} is flagged bad for {col!r}")
        series.append(PowerSeries(name, np.asarray(times), np.asarray(utils), flagged[0]))
    return series, col


def read_power_trace(
    paths: Path | str | Iterable[Path | str],
    column: str | None = None,
    on_bad_file: Callable[[TraceError], None] | None = None,
) -> PowerTrace:
    """Every series in the given files and directories (``*.csv``, ``*.csv.gz``), one column.

    ``column``: ``"production"`` (as the paper uses), ``"measured"``, or ``None`` for production
    when the first file has it and measured otherwise; every file must then have that column.
    ``on_bad_file``: None (a study) stops at the first bad file; a long-running service passes
    a callback that is told each bad file's error and keeps the good files, so one corrupt PDU
    export costs its own series, not the service. With no good file left the first error is raised.
    """
    files = _trace_files([paths] if isinstance(paths, str | Path) else paths)
    series: list[PowerSeries] = []
    seen: dict[str, Path] = {}
    col = column
    kept: list[Path] = []
    first_error: TraceError | None = None
    for path in files:
        try:
            got, file_col = read_power_file(path, col)
            for s in got:
                if s.name in seen:
                    raise TraceError(
                        path, f"series {s.name!r} was already read from {seen[s.name]}"
                    )
        except TraceError as exc:
            if on_bad_file is None:
                raise
            first_error = first_error or exc
            on_bad_file(exc)
            continue
        col = file_col
        for s in got:
            seen[s.name] = path
        series.extend(got)
        kept.append(path)
    if not series:
        assert first_error is not None  # _trace_files never returns an empty list
        raise first_error
    assert col is not None  # the first good file's column
    return PowerTrace(tuple(series), col, GOOGLE_LABEL, ", ".join(map(str, kept)))


class TracePower:
    """PowerSource replaying a trace: site i follows series i mod n from its own random offset.

    P_i(t) = 1 - u(s_i, slot(o_i + t)), clipped to [floor, 1] because a site with no spare power
    at all would make compute time infinite. Offsets are whole slots, so every site changes value
    on the 5-minute grid of its series; the clock wraps around the end of each series.
    """

    def __init__(
        self,
        trace: PowerTrace,
        num_sites: int,
        rng: np.random.Generator,
        floor: float = 0.01,
    ) -> None:
        if num_sites < 1:
            raise ValueError(f"need at least one site, got {num_sites}")
        if not 0 < floor <= 1:
            raise ValueError(f"power floor must be in (0, 1], got {floor}")
        self.trace = trace
        self.floor = floor
        n = len(trace.series)
        self.domain = np.arange(num_sites) % n
        slots = np.array([round(s.span_s(trace.slot_s) / trace.slot_s) for s in trace.series])
        self.offset_s = rng.integers(0, slots[self.domain]) * trace.slot_s
        self._spans = np.array([s.span_s(trace.slot_s) for s in trace.series])
        self._spare = [s.spare for s in trace.series]
        self._sites_of = [np.flatnonzero(self.domain == d) for d in range(n)]

    @property
    def label(self) -> str:
        return self.trace.label

    def power_at(self, t_s: float) -> NDArray[np.float64]:
        out = np.empty(self.domain.size)
        for d, sites in enumerate(self._sites_of):
            if sites.size == 0:
                continue
            s = self.trace.series[d]
            tau = s.time_s[0] + np.mod(self.offset_s[sites] + t_s, self._spans[d])
            i = np.searchsorted(s.time_s, tau, side="right") - 1
            out[sites] = self._spare[d][i]
        return np.clip(out, self.floor, 1.0)
