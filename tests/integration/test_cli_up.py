"""`powertrip up` as a user runs it: the whole cluster from one command, and clear errors."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from powertrip.services.cli.service_process import LaunchError, service_executable
from tests.integration.test_cli_experiment import powertrip

pytestmark = pytest.mark.slow


def test_up_trains_to_the_target_prints_endpoints_and_writes_rounds(tmp_path):
    out = tmp_path / "up"
    r = powertrip(
        "up",
        "--workers",
        "2",
        "--sites",
        "4",
        "--target",
        "0.3",
        "--output",
        str(out),
        tmp_path=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "target 0.3 reached" in r.stdout
    for name in ("profiler", "aggregator", "worker-0", "worker-1"):
        assert f"{name}" in r.stdout and "/metrics" in r.stdout
    rows = list(csv.DictReader((out / "rounds.csv").open()))
    assert rows and float(rows[-1]["accuracy"]) >= 0.3
    assert all(row["selected"].startswith("site-") for row in rows)
    assert "stopping the services" in r.stderr


@pytest.mark.extra("speech")
@pytest.mark.real_data("fsdd")
def test_up_trains_a_mounted_workload_with_its_natural_partition(tmp_path, shared_data):
    """FSDD by speaker instead of the preset's MNIST-1D: the aggregator's POWERTRIP_WORKLOAD,
    DATASET_PATH and PARTITION reach the workers through the run's config."""
    out = tmp_path / "up"
    r = powertrip(
        "up",
        "--workers",
        "2",
        "--sites",
        "6",
        "--workload",
        "fsdd",
        "--dataset-path",
        str(shared_data / "datasets" / "fsdd"),
        "--partition",
        "natural",
        "--max-rounds",
        "2",
        "--output",
        str(out),
        tmp_path=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader((out / "rounds.csv").open()))
    assert [row["round"] for row in rows] == ["1", "2"]
    assert all(row["outcome"] and row["selected"].startswith("site-") for row in rows)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--workers", "5", "--sites", "3"], "workers <= sites"),
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--workload", "fsdd"], "--workload fsdd needs --dataset-path"),
    ],
)
def test_up_refuses_bad_input_with_one_line_and_exit_2(tmp_path, args, words):
    r = powertrip("up", *args, "--output", str(tmp_path / "up"), tmp_path=tmp_path)
    assert r.returncode == 2
    assert words in r.stderr and "Traceback" not in r.stderr


def test_the_services_start_from_the_console_scripts_beside_the_interpreter():
    """The venv's own scripts, whatever else is on PATH: children import what the launcher does."""
    assert service_executable("worker") == str(Path(sys.executable).parent / "powertrip-worker")


def test_a_missing_service_command_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LaunchError, match=r"powertrip-worker not found next to .* or on PATH"):
        service_executable("worker")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize(
    ("kind", "env"),
    [
        ("worker", {"POWERTRIP_AGGREGATOR_ADDR": "127.0.0.1:1", "POWERTRIP_SITES": "0-1"}),
        ("aggregator", {"POWERTRIP_PROFILER_ADDR": "127.0.0.1:1"}),
    ],
)
def test_a_service_asked_for_a_gpu_it_lacks_exits_2_naming_the_variable(kind, env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("POWERTRIP_")}
    done = subprocess.run(
        [service_executable(kind)],
        env={**clean, **env, "POWERTRIP_DEVICE": "cuda", "POWERTRIP_INSECURE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "POWERTRIP_DEVICE='cuda'" in done.stderr and "CUDA is not available" in done.stderr


def test_up_shows_each_endpoint_when_ready_and_lingers_for_a_scraper(tmp_path):
    """The endpoints appear as each service starts (not only after the run), a Prometheus
    config lists them, and with --linger they still answer after the target is reached."""
    out = tmp_path / "up"
    env = {**os.environ, "POWERTRIP_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "powertrip.services.cli.main",
            "up",
            "--workers",
            "1",
            "--sites",
            "2",
            "--max-rounds",
            "2",
            "--linger",
            "30",
            "--output",
            str(out),
        ],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        urls, lines = [], []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, f"up ended early: {''.join(lines)}"
            lines.append(line)
            urls += re.findall(r"metrics (http://\S+/metrics)", line)
            if "stay up" in line:
                break
        assert len(urls) == 3  # profiler, aggregator, worker-0: each as it became ready
        assert all(ln.startswith("started") for ln in lines[:3])
        scrape = (out / "prometheus.yml").read_text()
        for url in urls:
            assert url.split("//")[1].split("/")[0] in scrape
            body = urllib.request.urlopen(url, timeout=10).read().decode()
            assert "powertrip_" in body
        agg = next(
            u
            for u in urls
            if "powertrip_round_current" in urllib.request.urlopen(u).read().decode()
        )
        assert "powertrip_round_current 2.0" in urllib.request.urlopen(agg).read().decode()
    finally:
        proc.terminate()
        proc.wait(30)
