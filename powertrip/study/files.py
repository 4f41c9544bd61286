"""How a study writes its output folder: CSV tables and the summary.json header both studies
share, so the PowerTrip and the curtailment study read alike and a table is written one way."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from powertrip.config.experiment import RunConfig


def write_csv(
    path: Path, header: Sequence[str], rows: Iterable[Sequence[object] | Mapping[str, object]]
) -> Path:
    """One header line, then a line per row (a sequence, or a mapping keyed by the header)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for row in rows:
            w.writerow([row[k] for k in header] if isinstance(row, Mapping) else row)
    return path


def summary_header(config: RunConfig) -> dict[str, object]:
    """The first keys of every summary.json: the preset's name and the full configuration."""
    return {"preset": config.name, "config": json.loads(config.model_dump_json())}


def data_label(workload: str, dataset_path: Path | None = None) -> str:
    """The data behind a study: "real", or what generated it (never passed off as real)."""
    if workload == "mnist1d":
        return "synthetic (mnist1d)"
    if workload == "lm" and dataset_path is None:
        return "synthetic (lm: embedded generated corpus)"
    return "real"


def runtime_facts(wall_seconds: float) -> dict[str, object]:
    """Wall time, and the torch thread count: float reduction order depends on it, so a seed
    reproduces bit for bit only at a fixed count."""
    return {"wall_seconds": round(wall_seconds, 2), "torch_threads": torch.get_num_threads()}


def json_safe(value: object) -> object:
    """NaN and infinities as null: JSON has neither."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: Path, data: Mapping[str, object]) -> Path:
    path.write_text(json.dumps(data, indent=2))
    return path
