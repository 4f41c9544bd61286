"""``--tensorboard`` and ``powertrip export-tensorboard`` as a user runs them: real processes,
event files TensorBoard reads back with the run clock as their wall time."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.cli import run_powertrip

pytestmark = pytest.mark.extra("tensorboard")
REPO = Path(__file__).resolve().parents[2]
TINY = ["--sites", "4", "--num-samples", "400", "--partition", "iid", "--sweep", "2,4"]
TINY += ["--max-rounds", "3", "--target", "0.15", "--policies", "powertrip", "--repeats", "1"]


powertrip = run_powertrip


def _accuracy(run_dir: Path) -> list:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return acc.Scalars("accuracy")


def _walls_follow_the_clock(events: list, clocks: list[float]) -> None:
    walls = [e.wall_time - events[0].wall_time for e in events]
    assert walls == pytest.approx([c - clocks[0] for c in clocks], abs=1e-3)


def test_experiment_writes_tensorboard_runs_after_its_outputs(tmp_path):
    out, tb = tmp_path / "run", tmp_path / "tb"
    proc = powertrip(
        "experiment",
        *TINY,
        "--no-plots",
        "--threads",
        "1",
        "--output",
        str(out),
        "--tensorboard",
        str(tb),
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"tensorboard --logdir {tb}" in proc.stdout
    with (out / "rounds.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if (r["policy"], r["repeat"]) == ("powertrip", "0")]
    events = _accuracy(tb / "powertrip" / "repeat-0")
    assert [e.step for e in events] == [int(r["round"]) for r in rows]
    _walls_follow_the_clock(events, [float(r["time_seconds"]) for r in rows])

    # the same folder exported again, standalone, reads the same
    again = powertrip("export-tensorboard", str(out), tmp_path=tmp_path)
    assert again.returncode == 0, again.stderr
    assert [e.value for e in _accuracy(out / "tensorboard" / "powertrip" / "repeat-0")] == [
        e.value for e in events
    ]


def test_curtail_writes_tensorboard_runs(tmp_path):
    out, tb = tmp_path / "run", tmp_path / "tb"
    proc = powertrip(
        "curtail",
        "--preset",
        "curtailment-quick",
        "--num-samples",
        "1000",
        "--shards",
        "10",
        "--policies",
        "curtailment",
        "--no-plots",
        "--threads",
        "1",
        "--output",
        str(out),
        "--tensorboard",
        str(tb),
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    with (out / "rounds.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["run"] == "curtailment"]
    events = _accuracy(tb / "curtailment" / "repeat-0")
    assert [e.step for e in events] == [int(r["round"]) for r in rows]
    _walls_follow_the_clock(events, [float(r["end_s"]) for r in rows])


def test_export_of_a_folder_without_rounds_fails_in_one_line(tmp_path):
    proc = powertrip("export-tensorboard", str(tmp_path), tmp_path=tmp_path)
    assert proc.returncode == 2
    assert "has no rounds.csv" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
