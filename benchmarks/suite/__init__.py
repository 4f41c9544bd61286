"""Sections of ``benchmarks/run.py``: each returns ``Row``s measured against a baseline taken in
the same run, so a ratio compares two figures from the same machine under the same load."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
REPO = BENCH.parent
for _p in (str(REPO), str(BENCH)):  # the library, and the older benchmark scripts to reuse
    if _p not in sys.path:
        sys.path.insert(0, _p)

MiB = 1 << 20


@dataclass
class Row:
    """One line of the table. ``ratio`` is measured/baseline for rates, baseline/measured for
    times (so above 1 always means "the project is faster"), unless ``note`` says otherwise.
    ``verdict`` is "PASS", "MISS" or "" (an informational row without a target)."""

    name: str
    measured: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    ratio: float | None = None
    target: str = ""
    verdict: str = ""
    note: str = ""
    # (min, max) of the measured figure over the repeats whose median ``measured`` is; every
    # timed row carries it, so a reader sees the noise next to the figure
    spread: tuple[float, float] | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def verdict(ok: bool) -> str:
    """Never rounds a miss up: the caller compares the unrounded figures."""
    return "PASS" if ok else "MISS"


def repeat_times(fn: Callable[[], object], repeats: int) -> list[float]:
    """Wall seconds of each of ``repeats`` calls (after the caller's own warm-up)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls (after the caller's own warm-up)."""
    return statistics.median(repeat_times(fn, repeats))


def rate_stats(nbytes: float, times: list[float]) -> tuple[float, tuple[float, float]]:
    """(median rate, (min rate, max rate)) of ``nbytes`` moved in each of ``times`` seconds."""
    return nbytes / statistics.median(times), (nbytes / max(times), nbytes / min(times))
