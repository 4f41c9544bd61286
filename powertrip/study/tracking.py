"""A study's per-round record in TensorBoard, the tracker users already read.

The export reads an output folder's CSVs rather than a study in memory, so one code path serves
``powertrip experiment``, ``powertrip curtail``, ``powertrip up`` and any past run. Each
(policy, repeat) becomes a TensorBoard run ``<policy>/repeat-<r>``; its scalars are logged at
step = round index and at wall time = export start + the *emulated* run clock, so TensorBoard's
time axes plot accuracy against the run clock (the paper's accuracy-vs-time curve), not against
the seconds the emulation took. Every run of one export starts at the same instant, so the Wall
axis compares policies; Relative counts from a curve's first point, which is clock 0 for
``clock/seconds`` (and for every curve of a CSV with a round 0) and otherwise the end of round 1.
TensorBoard is optional: it is imported only when an export runs, never at library import.
"""

from __future__ import annotations

import csv
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

INSTALL_HINT = "pip install 'powertrip[tensorboard]'"
#: Per-round columns logged as they are (when the CSV has them), and their TensorBoard tags.
ROUND_TAGS = {
    "accuracy": "accuracy",
    "loss": "loss",
    "perplexity": "perplexity",
    "contributions": "round/contributions",
    "samples": "round/samples",
}
#: Run totals of the curtailment study's runs.csv, logged at the last round.
CURTAIL_TOTALS = ("energy_kwh", "emissions_kg", "curtailed_energy_share", "training_site_hours")


class TrackingError(ValueError):
    """Input the export cannot read; the message is one line naming the file, line and field."""


@dataclass
class TrackedRound:
    step: int  # the round index
    clock_s: float  # emulated run clock at the end of the round
    scalars: dict[str, float]


@dataclass
class TrackedRun:
    policy: str
    repeat: int
    rounds: list[TrackedRound] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)  # logged once, at the last round
    facts: dict[str, str] = field(default_factory=dict)  # seed, time to accuracy: the run's text

    @property
    def name(self) -> str:
        return f"{_safe(self.policy)}/repeat-{self.repeat}"


def summary_writer() -> type[SummaryWriter]:
    """torch's ``SummaryWriter``, or a TrackingError that says which extra to install. Called
    before a long study too, so a missing package fails it up front, not after the run."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise TrackingError(
            f"TensorBoard export needs the tensorboard package: {INSTALL_HINT}"
        ) from exc
    return SummaryWriter


def export_tensorboard(source: Path, logdir: Path, start: float | None = None) -> list[Path]:
    """Write the runs of ``source`` (an output folder, or its rounds.csv) under ``logdir``; one
    event file per run, replacing a previous export's. ``start`` is the wall time of clock 0
    (default: now), shared by every run so the Wall axis compares them. Returns the run dirs."""
    writer_cls = summary_writer()
    runs, config = read_runs(Path(source))
    start = time.time() if start is None else start
    written = []
    for run in runs:
        run_dir = Path(logdir) / run.name
        for old in run_dir.glob("events.out.tfevents.*"):  # a re-export replaces, not doubles
            old.unlink()
        w = writer_cls(log_dir=str(run_dir))
        w.add_text("config", _describe(run, config), global_step=0, walltime=start)
        if not run.rounds or run.rounds[0].step > 0:  # clock 0 anchors the Relative axis
            w.add_scalar("clock/seconds", 0.0, 0, walltime=start)
        for r in run.rounds:
            w.add_scalar("clock/seconds", r.clock_s, r.step, walltime=start + r.clock_s)
            for tag, value in r.scalars.items():
                w.add_scalar(tag, value, r.step, walltime=start + r.clock_s)
        last = run.rounds[-1] if run.rounds else TrackedRound(0, 0.0, {})
        for name, value in run.totals.items():
            w.add_scalar(f"summary/{name}", value, last.step, walltime=start + last.clock_s)
        w.close()
        written.append(run_dir)
    return written


def read_runs(source: Path) -> tuple[list[TrackedRun], dict[str, object] | None]:
    """The runs of an output folder (or its rounds.csv), with what its results.csv (experiment)
    or runs.csv (curtail) adds, and the study's configuration from summary.json when present."""
    if source.is_dir():
        folder, rounds_csv = source, source / "rounds.csv"
    elif source.exists():
        folder, rounds_csv = source.parent, source
    else:
        raise TrackingError(f"{source}: no such file or folder")
    if not rounds_csv.is_file():
        raise TrackingError(
            f"{folder} has no rounds.csv (expected an output folder of powertrip experiment, "
            "curtail or up)"
        )
    runs: dict[tuple[str, int], TrackedRun] = {}
    for where, row in _rows(rounds_csv, required=("round", "accuracy")):
        curtail = "end_s" in row
        name = row["run"] if curtail else row.get("policy")
        if not name:
            raise TrackingError(f"{where}: field 'policy' is missing or empty")
        repeat = int(_num(row, "repeat", where)) if row.get("repeat") else 0
        scalars = {tag: _num(row, col, where) for col, tag in ROUND_TAGS.items() if row.get(col)}
        if curtail:  # sites are names joined by ';', the clock is the round's end
            clock = _num(row, "end_s", where)
            scalars["round/duration_seconds"] = clock - _num(row, "start_s", where)
            scalars["round/sites_selected"] = float(len([s for s in row["sites"].split(";") if s]))
        else:
            clock = _num(row, "time_seconds", where)
            scalars["round/duration_seconds"] = _num(row, "duration_seconds", where)
            scalars["round/sites_selected"] = _num(row, "sites", where)
        run = runs.setdefault((name, repeat), TrackedRun(name, repeat))
        run.rounds.append(TrackedRound(int(_num(row, "round", where)), clock, scalars))
    _add_run_facts(folder, runs)
    summary = folder / "summary.json"
    config = None
    if summary.is_file():
        try:
            config = json.loads(summary.read_text())
        except json.JSONDecodeError as exc:
            raise TrackingError(f"{summary} line {exc.lineno}: not valid JSON ({exc.msg})") from exc
    return list(runs.values()), config


def _add_run_facts(folder: Path, runs: dict[tuple[str, int], TrackedRun]) -> None:
    """Time to accuracy (and the curtailment runs' energy and emissions) from the study's
    per-run table, for the runs that have rounds."""
    results, curtail_runs = folder / "results.csv", folder / "runs.csv"
    if results.is_file():
        for where, row in _rows(results, required=("policy", "repeat")):
            run = runs.get((row["policy"], int(_num(row, "repeat", where))))
            if run is None:
                continue
            if row.get("time_to_accuracy_seconds"):
                tta = _num(row, "time_to_accuracy_seconds", where)
                run.totals["time_to_accuracy_seconds"] = tta
                run.facts["time to accuracy"] = f"{tta / 3600:.4f} h (round {row['rounds']})"
            else:
                run.facts["time to accuracy"] = "target not reached"
            run.facts["seed"] = row.get("seed", "")
    elif curtail_runs.is_file():
        for where, row in _rows(curtail_runs, required=("run",)):
            run = runs.get((row["run"], 0))
            if run is None:
                continue
            if row.get("time_to_accuracy_hours"):
                tta_h = _num(row, "time_to_accuracy_hours", where)
                run.totals["time_to_accuracy_seconds"] = tta_h * 3600
                run.facts["time to accuracy"] = f"{tta_h:.4f} h"
            else:
                run.facts["time to accuracy"] = "target not reached"
            run.totals |= {k: _num(row, k, where) for k in CURTAIL_TOTALS if row.get(k)}


def _rows(path: Path, required: tuple[str, ...]):  # noqa: ANN202 - yields (where, row)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in required if c not in (reader.fieldnames or ())]
        if missing:
            raise TrackingError(f"{path} line 1: missing column(s) {', '.join(missing)}")
        for row in reader:
            yield f"{path} line {reader.line_num}", row


def _num(row: dict[str, str], column: str, where: str) -> float:
    value = row.get(column)
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TrackingError(f"{where}: field {column!r}: {value!r} is not a number") from None


def _safe(name: str) -> str:
    """A policy name as one directory level: nothing from the CSV may leave the logdir."""
    cleaned = re.sub(r"[^A-Za-z0-9._+-]", "_", name)
    return "_" + cleaned if cleaned.strip(".") == "" else cleaned


def _describe(run: TrackedRun, summary: dict[str, object] | None) -> str:
    """The run's text tab: what it is, how to read the axes, the study's full configuration."""
    facts = {"run": run.name, **run.facts}
    if summary and summary.get("target_accuracy") is not None:
        facts["target accuracy"] = str(summary["target_accuracy"])
    lines = [f"**{k}**: {v}  " for k, v in facts.items() if v]
    lines.append("Step = round; wall time = export start + the emulated run clock (clock/seconds).")
    if summary and "config" in summary:
        body = json.dumps(summary["config"], indent=2).splitlines()
        lines += ["", *("    " + line for line in body)]  # a markdown code block
    return "\n".join(lines)
