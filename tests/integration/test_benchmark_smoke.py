"""Benchmarks are not timed here, but they must not rot: each runs small against the current
code and its output is checked for what it claims to measure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_benchmark(script: str, *args: str, timeout_s: float) -> str:
    """``benchmarks/<script>`` with ``args``: its stdout, once it exited 0."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def test_the_upload_memory_benchmark_folds_every_update_correctly():
    out = run_benchmark(
        "bench_upload_rss.py",
        "--model-mib",
        "4",
        "--uploads",
        "2",
        "--timeout",
        "240",  # the uploads' deadline: generous, the test checks the fold, not the speed
        timeout_s=600,
    )
    assert out.count("model correct (2/2 folded)") == 2  # streaming and naive


def test_the_site_training_benchmark_runs_every_engine_against_the_plain_loop():
    args = ["--sites", "2", "--steps", "1", "--repeats", "1", "--models", "cnn1d"]
    out = run_benchmark("bench_site_training.py", *args, timeout_s=300)
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| cnn1d")]
    methods = {r[2].strip() for r in rows}
    assert methods == {"plain loop", "auto (stacked)", "vmap", "stacked", "in-turn"}
    assert all(float(r[8]) < 1e-5 for r in rows)  # the same update, to float rounding


def test_the_benchmark_runner_runs_quick(tmp_path):
    out = tmp_path / "bench.json"
    printed = run_benchmark("run.py", "--quick", "--json", str(out), timeout_s=300)
    report = json.loads(out.read_text())
    sections = {"training", "upload", "fold", "intake", "decision", "rounds", "overhead"}
    assert set(report["sections"]) == sections
    (overhead,) = report["sections"]["overhead"]["rows"]  # both sides timed round to round
    assert overhead["baseline"] > 0 and overhead["target"] == "<= 1.2x" and overhead["spread"]
    assert report["machine"]["cores"] >= 1 and report["machine"]["torch"]
    for section in report["sections"].values():
        assert section["rows"], section
        for row in section["rows"]:
            assert row["measured"] > 0 and row["verdict"] in ("PASS", "MISS", "")
    assert "| PASS" in printed or "| MISS" in printed  # the table was printed


def test_the_stream_window_benchmark_shows_the_window_over_rtt_bound():
    # one stream cannot beat window / RTT: with the relay's 50 ms, a 4 MiB window caps it at
    # 80 MiB/s, below what the relay itself moves without a delay (~365 MiB/s here)
    out = run_benchmark(
        "bench_stream_window.py",
        "--rtt-ms",
        "50",
        "--windows",
        "4",
        "--mib",
        "16",
        timeout_s=120,
    )
    fixed, bdp = [line.split() for line in out.splitlines() if line.lstrip().startswith("50 ")]
    assert fixed[1:4] == ["window", "4", "MiB"] and bdp[1:3] == ["gRPC", "default"]
    assert 0 < float(fixed[4]) <= 4 / 0.050 * 1.05


def test_the_site_engine_benchmark_times_the_engine_against_the_plain_loop_and_over_ranks():
    out = run_benchmark(
        "bench_site_engine.py",
        "--device",
        "cpu",
        "--layers",
        "1",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--context",
        "8",
        "--vocab",
        "16",
        "--batch",
        "4",
        "--steps",
        "2",
        "--repeats",
        "1",
        "--ranks",
        "1,2",
        "--sections",
        "a,b",
        timeout_s=240,
    )
    lines = out.splitlines()
    engine = next(line for line in lines if line.startswith("site engine (round)"))
    ratio = engine.split()[6]  # site engine (round) min median max ratio
    assert ratio.endswith("x") and float(ratio[:-1]) > 0
    ranks = [line.split() for line in lines if line.strip()[:1].isdigit()]
    assert [r[0] for r in ranks] == ["1", "2"] and ranks[1][-1].endswith("%")
