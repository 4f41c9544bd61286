"""Carbon-intensity traces and the curtailment windows they define (arXiv 2602.22760).

Two file formats, told apart by their header:

* WattTime-style marginal intensity (MOER/"MCI"): a time column (``point_time``, ``time``, ...)
  then one column per region, e.g. ``point_time,CAISO_NORTH,SPP_TX,NEM_SA,DE``.
* Electricity Maps hourly exports: ``Datetime (UTC)``, ``Zone Id``, ``Carbon Intensity
  gCO₂eq/kWh (direct)`` / ``(LCA)``, ``Data Estimated`` (counted as flagged, not dropped), ...

Values are read as gCO2/kWh, exactly as the curtailment paper's notebook does (WattTime's own
unit is lbs/MWh). A sample holds until the next one (forward fill); the last holds for one
sampling step.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from powertrip.config.carbon import HOLD_S, THRESHOLD
from powertrip.traces.io import (
    TraceError,
    ar1,
    check_width,
    csv_rows,
    parse_bool,
    parse_number,
    parse_timestamp,
    read_header,
)

WATTTIME_LABEL = "watttime-mci"
EMAPS_LABEL = "electricitymaps"
SYNTHETIC_LABEL = "synthetic-carbon"
EMAPS_TIME = "Datetime (UTC)"
EMAPS_ZONE = "Zone Id"
EMAPS_ESTIMATED = "Data Estimated"


@dataclass(frozen=True)
class CarbonTrace:
    """Intensity of several regions on one time axis (seconds after ``start``)."""

    regions: tuple[str, ...]
    start: datetime  # UTC time of time_s == 0
    time_s: NDArray[np.float64]  # sample times, strictly increasing, time_s[0] == 0
    intensity: NDArray[np.float64]  # (regions, samples), gCO2/kWh
    step_s: float  # sampling step; the last sample holds this long
    label: str  # "watttime-mci", "electricitymaps-direct", "synthetic-carbon", ...
    source: str
    flagged: tuple[int, ...] = ()  # per region: estimated rows (Electricity Maps)

    def __post_init__(self) -> None:
        if self.intensity.shape != (len(self.regions), self.time_s.size):
            raise ValueError("intensity must have shape (regions, samples)")
        if not self.flagged:
            object.__setattr__(self, "flagged", (0,) * len(self.regions))

    @property
    def end_s(self) -> float:
        return float(self.time_s[-1] + self.step_s)

    def series(self, region: str) -> NDArray[np.float64]:
        return self.intensity[self.regions.index(region)]

    def intensity_at(self, t_s: float) -> NDArray[np.float64]:
        """Every region's intensity at t (forward fill; clamped to the first/last sample)."""
        i = int(np.searchsorted(self.time_s, t_s, side="right")) - 1
        return self.intensity[:, max(i, 0)]


def carbon_format(header: list[str]) -> str | None:
    """The carbon format of a header: "electricitymaps", "watttime" or None."""
    if any(h.endswith("_power_util") for h in header):  # a power trace's "time" column
        return None
    if EMAPS_TIME in header and any(h.startswith("Carbon Intensity") for h in header):
        return "electricitymaps"
    first = header[0].lower()
    time_first = len(header) >= 2 and ("time" in first or "date" in first)
    if time_first and all(h and "time" not in h.lower() for h in header[1:]):
        return "watttime"
    return None


def _step(time_s: NDArray[np.float64], default: float) -> float:
    return float(np.median(np.diff(time_s))) if time_s.size > 1 else default


def _check_time(path: Path, line: int, column: str, t: float, prev: float | None) -> None:
    if prev is not None and t <= prev:
        raise TraceError(path, "time does not increase (repeated or out of order)", line, column)


def _intensity(path: Path, line: int, column: str, text: str) -> float:
    v = parse_number(path, line, column, text)
    if v < 0:
        raise TraceError(path, f"negative intensity {v:g}", line, column)
    return v


def read_watttime_csv(path: Path | str, label: str = WATTTIME_LABEL) -> CarbonTrace:
    """Time column first, one intensity column per region (timestamps ISO, naive = UTC)."""
    path = Path(path)
    rows = csv_rows(path)
    _, header = next(rows)
    if carbon_format(header) != "watttime":
        raise TraceError(path, "not a WattTime-style header (time column, then regions)", 1)
    regions = header[1:]
    if len(set(regions)) != len(regions):
        raise TraceError(path, "a region column appears twice", 1)
    stamps: list[float] = []
    values: list[list[float]] = []
    for line, fields in rows:
        check_width(path, line, fields, header)
        at = parse_timestamp(path, line, header[0], fields[0]).timestamp()
        _check_time(path, line, header[0], at, stamps[-1] if stamps else None)
        stamps.append(at)
        row = zip(regions, fields[1:], strict=True)
        values.append([_intensity(path, line, r, x) for r, x in row])
    t = np.asarray(stamps)
    return CarbonTrace(
        tuple(regions),
        datetime.fromtimestamp(t[0], UTC),
        t - t[0],
        np.asarray(values).T.copy(),
        _step(t, 300.0),
        label,
        str(path),
    )


def read_electricitymaps_csv(path: Path | str, basis: str = "direct") -> CarbonTrace:
    """Hourly Electricity Maps export; one region per ``Zone Id`` (several zones must share
    their timestamps). ``basis``: "direct" or "LCA" intensity."""
    path = Path(path)
    rows = csv_rows(path)
    _, header = next(rows)
    if carbon_format(header) != "electricitymaps":
        raise TraceError(path, "not an Electricity Maps header", 1)
    wanted = f"({basis.lower()})"
    cols = [h for h in header if h.startswith("Carbon Intensity") and h.lower().endswith(wanted)]
    if not cols:
        raise TraceError(path, f"no 'Carbon Intensity ... {wanted}' column", 1)
    ci, ti = header.index(cols[0]), header.index(EMAPS_TIME)
    zi = header.index(EMAPS_ZONE) if EMAPS_ZONE in header else None
    ei = header.index(EMAPS_ESTIMATED) if EMAPS_ESTIMATED in header else None
    default_zone = path.name.split("_")[0]
    zones: dict[str, tuple[list[float], list[float], list[int]]] = {}
    for line, fields in rows:
        check_width(path, line, fields, header)
        zone = fields[zi] if zi is not None and fields[zi] else default_zone
        stamps, values, estimated = zones.setdefault(zone, ([], [], [0]))
        at = parse_timestamp(path, line, EMAPS_TIME, fields[ti]).timestamp()
        _check_time(path, line, EMAPS_TIME, at, stamps[-1] if stamps else None)
        stamps.append(at)
        values.append(_intensity(path, line, cols[0], fields[ci]))
        if ei is not None and parse_bool(path, line, EMAPS_ESTIMATED, fields[ei]):
            estimated[0] += 1
    names = list(zones)
    t = np.asarray(zones[names[0]][0])
    for z in names[1:]:
        if not np.array_equal(np.asarray(zones[z][0]), t):
            raise TraceError(path, f"zones {names[0]!r} and {z!r} have different timestamps")
    return CarbonTrace(
        tuple(names),
        datetime.fromtimestamp(t[0], UTC),
        t - t[0],
        np.asarray([zones[z][1] for z in names]),
        _step(t, 3600.0),
        f"{EMAPS_LABEL}-{basis.lower()}",
        str(path),
        tuple(zones[z][2][0] for z in names),
    )


def read_carbon_trace(path: Path | str, basis: str = "direct") -> CarbonTrace:
    """Either format, chosen by the header."""
    path = Path(path)
    kind = carbon_format(read_header(path))
    if kind == "electricitymaps":
        return read_electricitymaps_csv(path, basis)
    if kind == "watttime":
        return read_watttime_csv(path)
    raise TraceError(path, "not a carbon-intensity trace (WattTime or Electricity Maps)", 1)


def curtailment_windows_of(
    time_s: NDArray[np.float64],
    intensity: NDArray[np.float64],
    end_s: float,
    threshold: float = THRESHOLD,
    hold_s: float = HOLD_S,
) -> list[tuple[float, float]]:
    """[start, end) intervals during which a site is curtailed, from a forward-filled series.

    The curtailment paper's rule (its prototype polls every 10 s) in continuous time: the site
    enters the moment intensity < threshold; once in, intensity > threshold marks it and
    intensity <= threshold clears the mark; it leaves ``hold_s`` after the mark if the mark was
    never cleared up to and including that moment.
    Intensity exactly at the threshold neither enters nor marks. A window still open at
    ``end_s`` ends there.
    """
    if hold_s < 0:
        raise ValueError(f"hold time must be >= 0 s, got {hold_s}")
    windows: list[tuple[float, float]] = []
    start: float | None = None
    mark: float | None = None
    for t, v in zip(time_s.tolist(), intensity.tolist(), strict=True):
        if start is not None and mark is not None and t > mark + hold_s:
            windows.append((start, mark + hold_s))
            start, mark = None, None
        if start is None:
            if v < threshold:
                start = t
        elif v <= threshold:
            mark = None
        elif mark is None:
            mark = t
    if start is not None:
        end = end_s if mark is None else min(mark + hold_s, end_s)
        windows.append((start, end))
    return windows


def curtailment_windows(
    trace: CarbonTrace, threshold: float = THRESHOLD, hold_s: float = HOLD_S
) -> dict[str, list[tuple[float, float]]]:
    """Curtailment windows per region, in seconds after ``trace.start``.

    Pure: no provisioning delay (240 s in the paper's logged run); whoever turns windows into site
    availability adds it.
    """
    return {
        r: curtailment_windows_of(trace.time_s, trace.intensity[i], trace.end_s, threshold, hold_s)
        for i, r in enumerate(trace.regions)
    }


def synthetic_carbon_trace(
    regions: tuple[str, ...] = ("region-0", "region-1", "region-2"),
    hours: float = 24.0,
    step_s: float = 300.0,
    seed: int = 0,
    base_range: tuple[float, float] = (200.0, 500.0),
    noise_sigma: float = 20.0,
    ar_coef: float = 0.9,
) -> CarbonTrace:
    """A labelled stand-in for marginal intensity: a per-region base level (evenly spaced over
    ``base_range``) with a daytime solar dip of random depth and phase, plus AR(1) noise, so
    low-carbon windows come and go like in the curtailment paper's trace. Deterministic."""
    if not regions:
        raise ValueError("need at least one region")
    steps = int(round(hours * 3600.0 / step_s))
    if steps < 1:
        raise ValueError(f"{hours} h is shorter than one {step_s:g} s step")
    rng = np.random.default_rng(seed)
    t = np.arange(steps, dtype=np.float64) * step_s
    out = np.empty((len(regions), steps))
    for r, base in enumerate(np.linspace(*base_range, len(regions))):
        depth = rng.uniform(0.6, 0.9)
        phase = rng.uniform(0.0, 2 * np.pi)
        solar = np.maximum(0.0, np.sin(2 * np.pi * t / 86_400.0 + phase))
        first = rng.normal(0.0, noise_sigma)
        shocks = rng.normal(0.0, noise_sigma * np.sqrt(1 - ar_coef**2), size=steps)
        noise = ar1(first, shocks, ar_coef)
        out[r] = np.maximum(base * (1.0 - depth * solar) + noise, 1.0)
    return CarbonTrace(
        tuple(regions),
        datetime(2026, 1, 1, tzinfo=UTC),
        t,
        out,
        step_s,
        SYNTHETIC_LABEL,
        f"embedded generator, seed {seed}",
    )
