"""The memory benchmark still runs against the current servicer (a tiny model, two uploads):
benchmarks are not timed here, but they must not rot."""

from __future__ import annotations

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
    assert row[0] == "2" and row[4].endswith("x") and row[5].endswith("x")
