"""`powertrip curtail` as a user runs it: a real process, its files, and one-line errors."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--preset", "curtailment-quick", "--num-samples", "1000", "--shards", "10"]


def powertrip(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "POWERTRIP_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "powertrip.services.cli.main", "curtail", *args, "--threads", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_curtail_writes_the_table_outputs_and_plots(tmp_path):
    out = tmp_path / "run"

    proc = powertrip(*SMALL, "--policies", "curtailment", "--output", str(out), tmp_path=tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert "curtailment" in proc.stdout and "single-site" in proc.stdout
    with (out / "runs.csv").open() as f:
        runs = {r["run"]: r for r in csv.DictReader(f)}
    assert set(runs) == {"curtailment", "always-on-fl", "single-site"}
    assert runs["curtailment"]["availability"] == "curtailed"
    assert 0 < float(runs["curtailment"]["curtailed_energy_share"]) <= 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["carbon_trace"]["label"] == "synthetic-carbon"
    assert summary["data_label"] == "synthetic (mnist1d)"
    with (out / "availability.csv").open() as f:
        kinds = {r["event"] for r in csv.DictReader(f)}
    assert kinds == {"provisioned", "ready", "deprovisioned"}
    for png in ("availability_timeline", "mode_over_time", "cumulative_emissions"):
        assert (out / f"{png}.png").stat().st_size > 0


def test_bad_values_end_with_one_line_naming_the_flag(tmp_path):
    proc = powertrip("--threshold", "-1", "--policies", "fastest", tmp_path=tmp_path)

    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "--threshold" in lines[0] and "unknown policy 'fastest'" in lines[0]


def test_a_region_missing_from_the_trace_is_named(tmp_path):
    proc = powertrip("--regions", "region-0,NOPE", "--no-plots", tmp_path=tmp_path)

    assert proc.returncode == 2
    assert "NOPE not in the carbon trace" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_carbon_file_that_is_not_a_trace_is_refused_with_its_name(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")

    proc = powertrip("--carbon-trace", str(bad), "--no-plots", tmp_path=tmp_path)

    assert proc.returncode == 2
    assert "bad.csv" in proc.stderr and "Traceback" not in proc.stderr
