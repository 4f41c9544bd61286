"""The memory benchmark still runs against the current servicer (a tiny model, two uploads):
benchmarks are not timed here, but they must not rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_upload_memory_benchmark_folds_every_update_correctly():
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_upload_rss.py"),
         "--model-mib", "4", "--uploads", "2", "--timeout", "60"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("model correct (2/2 folded)") == 2  # streaming and naive


@pytest.mark.slow  # one inductor compile
def test_the_trainer_device_benchmark_runs_every_method_on_the_cpu():
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_trainer_device.py"),
         "--device", "cpu", "--sites", "2", "--repeats", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    row = done.stdout.strip().splitlines()[-1].split()
    assert row[0] == "2" and all(r.endswith("x") for r in row[5:8])  # stacked, compiled, 1-by-1


def test_the_benchmark_runner_runs_quick(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["sections"]) == {"training", "upload", "fold", "decision", "rounds"}
    assert report["machine"]["cores"] >= 1 and report["machine"]["torch"]
    for section in report["sections"].values():
        assert section["rows"], section
        for row in section["rows"]:
            assert row["measured"] > 0 and row["verdict"] in ("PASS", "MISS", "")
    assert "| PASS" in done.stdout or "| MISS" in done.stdout  # the table was printed


def test_the_stream_window_benchmark_shows_the_window_over_rtt_bound():
    # one stream cannot beat window / RTT: with the relay's 50 ms, a 4 MiB window caps it at
    # 80 MiB/s, below what the relay itself moves without a delay (~145 MiB/s here)
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_stream_window.py"),
         "--rtt-ms", "50", "--windows", "4", "--mib", "16"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.lstrip().startswith("50 ")]
    fixed, bdp = rows
    assert fixed[1:4] == ["window", "4", "MiB"] and bdp[1:3] == ["gRPC", "default"]
    assert 0 < float(fixed[4]) <= 4 / 0.050 * 1.05
