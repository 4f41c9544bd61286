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
from dataclasses import dataclass
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


def killed_after(command: str, args: list[str], out: Path, tmp_path: Path, runs: int = 1) -> int:
    """Start ``powertrip COMMAND ARGS --output OUT``, SIGKILL it once ``runs`` runs are
    recorded, and say how many were when it died."""
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
        while recorded_runs(out) < runs:
            assert proc.poll() is None, f"it ended before recording {runs}: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "no run recorded in 300 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    return recorded_runs(out)


def completed(
    command: str, args: list[str], out: Path, tmp_path: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    proc = run_powertrip(command, *args, "--output", str(out), *extra, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc


@dataclass(frozen=True)
class Resumed:
    whole: Path  # the study run through
    resumed: Path  # the study killed twice and resumed
    stderr: str  # the last resume's
    kills: tuple[int, int]  # runs recorded at each kill
    first_rounds: list[str]  # rounds.csv right after the first kill
    first_summary: bool  # whether summary.json existed then


@pytest.fixture(scope="module")
def experiment_runs(tmp_path_factory) -> Resumed:
    """Killed after its first run, then resumed and killed again after the sweep's 4 runs: the
    powertrip runs then train the rounds the uninterrupted study took from its trajectory cache,
    and k* and static-optimal come from runs read back."""
    tmp = tmp_path_factory.mktemp("resume")
    whole, resumed = tmp / "whole", tmp / "resumed"
    completed("experiment", STUDY, whole, tmp)
    first = killed_after("experiment", STUDY, resumed, tmp)
    rounds = (resumed / "rounds.csv").read_text().splitlines()
    summary = (resumed / "summary.json").exists()
    second = killed_after("experiment", [*STUDY, "--resume"], resumed, tmp, runs=4)
    proc = completed("experiment", STUDY, resumed, tmp, "--resume")
    return Resumed(whole, resumed, proc.stderr, (first, second), rounds, summary)


def test_an_interrupted_study_resumes_to_the_same_results(experiment_runs):
    r = experiment_runs
    first, second = r.kills

    assert 1 <= first < 4 <= second < 6, "each kill must land inside the study"
    assert f"{second} runs recorded" in r.stderr
    assert (r.resumed / "results.csv").read_bytes() == (r.whole / "results.csv").read_bytes()
    assert (r.resumed / "rounds.csv").read_bytes() == (r.whole / "rounds.csv").read_bytes()
    a, b = (json.loads((d / "summary.json").read_text()) for d in (r.whole, r.resumed))
    for key in ("config", "target_accuracy", "k_star", "policies", "static_sweep"):
        assert a[key] == b[key], key
    assert recorded_runs(r.resumed) == 6 + 1  # every run, then the end of the study


def test_the_results_grow_run_by_run(experiment_runs):
    """Killed after its first run, the folder already held that run's rounds, whole."""
    r = experiment_runs
    assert r.first_rounds[0].startswith("policy,repeat,round")
    assert len(r.first_rounds) - 1 >= 4 * r.kills[0]  # each recorded run's 4 rounds
    assert not r.first_summary


def test_a_resume_of_another_configuration_is_refused(experiment_runs, tmp_path):
    resumed = experiment_runs.resumed
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
    resumed = experiment_runs.resumed
    before = {p.name: p.stat().st_mtime_ns for p in resumed.iterdir()}

    proc = completed("experiment", STUDY, resumed, tmp_path, "--resume")

    assert "is complete (6 runs recorded); nothing to do" in proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in resumed.iterdir()} == before


def test_a_study_folder_is_refused_without_resume(experiment_runs, tmp_path):
    resumed = experiment_runs.resumed

    proc = run_powertrip("experiment", *STUDY, "--output", str(resumed), tmp_path=tmp_path)

    assert proc.returncode == 2
    assert "holds a study already (runs.jsonl); pass --resume to continue it" in proc.stderr


def test_an_interrupted_curtailment_study_resumes_to_the_same_outputs(tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    completed("curtail", CURTAIL, whole, tmp_path)
    assert killed_after("curtail", CURTAIL, resumed, tmp_path) < 3

    proc = completed("curtail", CURTAIL, resumed, tmp_path, "--resume")

    assert "runs recorded" in proc.stderr
    for table in ("runs.csv", "rounds.csv", "baselines.csv", "modes.csv", "availability.csv"):
        assert (resumed / table).read_bytes() == (whole / table).read_bytes(), table
