"""A study keeps each run as it finishes and ``--resume`` continues an interrupted one: killed
after its first run, the resumed study writes the same results.csv (byte for byte) and the same
rounds.csv as the study that ran through; a resume refuses another configuration's folder and
leaves a complete study alone. Real processes, a real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli import REPO, run_powertrip

pytestmark = pytest.mark.slow

#: 2 policies x 2 repeats over a two-point sweep: 6 runs, k* and static-optimal read across them
STUDY = [
    "--preset",
    "quick",
    "--num-samples",
    "2000",
    "--sites",
    "6",
    "--sweep",
    "2,6",
    "--max-rounds",
    "4",
    "--policies",
    "powertrip,static-optimal",
    "--repeats",
    "2",
    "--threads",
    "1",
    "--no-plots",
]
CURTAIL = [
    "--preset",
    "curtailment-quick",
    "--num-samples",
    "1000",
    "--shards",
    "10",
    "--policies",
    "curtailment",
    "--threads",
    "1",
    "--no-plots",
]


def recorded_runs(out: Path) -> int:
    """Whole run lines in the folder's record (the header and a torn tail not counted)."""
    try:
        data = (out / "runs.jsonl").read_bytes()
    except FileNotFoundError:
        return 0
    return max(data.count(b"\n") - 1, 0)


def killed_after_first_run(command: str, args: list[str], out: Path, tmp_path: Path) -> None:
    """Start ``powertrip COMMAND ARGS --output OUT`` and SIGKILL it once a run is recorded."""
    env = {**os.environ, "POWERTRIP_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "powertrip.services.cli.main", command, *args, "--output", str(out)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300
        while recorded_runs(out) < 1:
            assert proc.poll() is None, f"it ended before recording a run: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "no run recorded in 300 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


def completed(
    command: str, args: list[str], out: Path, tmp_path: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    proc = run_powertrip(command, *args, "--output", str(out), *extra, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def experiment_runs(tmp_path_factory):
    """(uninterrupted folder, resumed folder, the resume's stderr, runs recorded at the kill)."""
    tmp = tmp_path_factory.mktemp("resume")
    whole, resumed = tmp / "whole", tmp / "resumed"
    completed("experiment", STUDY, whole, tmp)
    killed_after_first_run("experiment", STUDY, resumed, tmp)
    at_kill = recorded_runs(resumed)
    proc = completed("experiment", STUDY, resumed, tmp, "--resume")
    return whole, resumed, proc.stderr, at_kill


def test_an_interrupted_study_resumes_to_the_same_results(experiment_runs):
    whole, resumed, stderr, at_kill = experiment_runs

    assert 1 <= at_kill < 6, "the kill must land inside the study"
    assert f"{at_kill} runs recorded" in stderr
    assert (resumed / "results.csv").read_bytes() == (whole / "results.csv").read_bytes()
    assert (resumed / "rounds.csv").read_bytes() == (whole / "rounds.csv").read_bytes()
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, resumed))
    for key in ("config", "target_accuracy", "k_star", "policies", "static_sweep"):
        assert a[key] == b[key], key
    assert recorded_runs(resumed) == 6 + 1  # every run, then the end of the study


def test_the_results_grow_run_by_run(tmp_path):
    """Killed after its first run, the folder already holds that run's rows."""
    out = tmp_path / "o"
    killed_after_first_run("experiment", STUDY, out, tmp_path)
    rounds = (out / "rounds.csv").read_text().splitlines()
    assert rounds[0].startswith("policy,repeat,round")
    assert len(rounds) - 1 >= 4 * recorded_runs(out)  # each recorded run's 4 rounds, whole
    assert not (out / "summary.json").exists()


def test_a_resume_of_another_configuration_is_refused(experiment_runs, tmp_path):
    _, resumed, _, _ = experiment_runs
    other = [*STUDY]
    other[other.index("--max-rounds") + 1] = "5"

    proc = run_powertrip(
        "experiment", *other, "--output", str(resumed), "--resume", tmp_path=tmp_path
    )

    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: --output {resumed}: holds a study of another configuration: max_rounds 4 "
        "there, 5 now"
    ]


def test_a_complete_study_is_left_alone(experiment_runs, tmp_path):
    _, resumed, _, _ = experiment_runs
    before = {p.name: p.stat().st_mtime_ns for p in resumed.iterdir()}

    proc = completed("experiment", STUDY, resumed, tmp_path, "--resume")

    assert "is complete (6 runs recorded); nothing to do" in proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in resumed.iterdir()} == before


def test_a_study_folder_is_refused_without_resume(experiment_runs, tmp_path):
    _, resumed, _, _ = experiment_runs

    proc = run_powertrip("experiment", *STUDY, "--output", str(resumed), tmp_path=tmp_path)

    assert proc.returncode == 2
    assert "holds a study already (runs.jsonl); pass --resume to continue it" in proc.stderr


def test_an_interrupted_curtailment_study_resumes_to_the_same_outputs(tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    completed("curtail", CURTAIL, whole, tmp_path)
    killed_after_first_run("curtail", CURTAIL, resumed, tmp_path)

    proc = completed("curtail", CURTAIL, resumed, tmp_path, "--resume")

    assert "runs recorded" in proc.stderr
    for table in ("runs.csv", "rounds.csv", "baselines.csv", "modes.csv", "availability.csv"):
        assert (resumed / table).read_bytes() == (whole / table).read_bytes(), table
