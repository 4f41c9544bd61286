"""`powertrip experiment` as a user runs it: real process, real files, clear errors."""

from __future__ import annotations

import csv
import gzip
import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.cli import run_powertrip

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "--sites",
    "8",
    "--sweep",
    "2,4,8",
    "--max-rounds",
    "5",
    "--target",
    "0.3",
    "--policies",
    "powertrip,static-optimal,centralized-25",
    "--repeats",
    "1",
]


powertrip = run_powertrip


def run_to(out: Path, *args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`powertrip experiment ARGS --no-plots --output OUT`, which must succeed."""
    proc = powertrip("experiment", *args, "--no-plots", "--output", str(out), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_experiment_writes_table_results_and_plots(tmp_path):
    out = tmp_path / "run"
    proc = powertrip("experiment", *TINY, "--output", str(out), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "powertrip" in proc.stdout and "static-optimal" in proc.stdout
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {"policy", "repeat", "time_to_accuracy_seconds", "rounds", "reached_target"} <= set(
        rows[0]
    )
    assert {r["policy"] for r in rows} >= {"powertrip", "static-optimal", "centralized-25"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["k_star"] in (2, 4, 8)
    assert summary["data_label"].startswith("synthetic")
    for png in (
        "tta_bars.png",
        "static_sweep.png",
        "sites_over_time.png",
        "accuracy_over_time.png",
    ):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "powertrip,warp-drive"], "unknown policy 'warp-drive'"),
        (["--update-gb", "-1"], "--update-gb"),
        (["--target", "1.5"], "target accuracy must be in (0, 1]"),
        (["--target", "0"], "target accuracy must be in (0, 1]"),
        (["--workload", "mnist", "--dataset-path", "/nonexistent/mnist"], "does not exist"),
        (["--workload", "emnist"], "needs --dataset-path"),
        (["--preset", "nope"], "nope"),
        (["--partition", "natural"], "natural partition needs natural groups"),
        (["--target", "high"], "neither a number nor 'auto'"),
    ],
)
def test_bad_input_fails_with_a_clear_message_and_no_traceback(args, message, tmp_path):
    proc = powertrip("experiment", *TINY, *args, "--output", str(tmp_path / "o"), tmp_path=tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_malformed_dataset_file_is_named_in_the_error(tmp_path):
    bad = tmp_path / "idx"
    bad.mkdir()
    with gzip.open(bad / "t10k-images-idx3-ubyte.gz", "wb") as f:
        f.write(b"\x00\x00\x08\x03" + (10).to_bytes(4, "big") + b"\x00" * 20)  # truncated
    with gzip.open(bad / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write(b"\x00\x00\x08\x01" + (10).to_bytes(4, "big") + bytes(10))
    proc = powertrip(
        "experiment",
        *TINY,
        "--workload",
        "mnist",
        "--dataset-path",
        str(bad),
        "--output",
        str(tmp_path / "o"),
        tmp_path=tmp_path,
    )
    assert proc.returncode != 0
    assert "t10k-images-idx3-ubyte.gz" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_lists_presets_and_overrides(tmp_path):
    proc = powertrip("experiment", "--help", tmp_path=tmp_path)
    assert proc.returncode == 0
    for text in ("quick", "paper-uniform", "--policies", "--update-gb", "--target", "--output"):
        assert text in proc.stdout


@pytest.mark.real_data("mnist")
def test_real_mnist_idx_files_train_through_the_emulator(shared_data, tmp_path):
    mnist = shared_data / "datasets" / "mnist_t10k"
    out = tmp_path / "mnist"
    run_to(
        out,
        "--workload",
        "mnist",
        "--dataset-path",
        str(mnist),
        "--sites",
        "4",
        "--sweep",
        "2,4",
        "--max-rounds",
        "2",
        "--target",
        "0.99",
        "--local-steps",
        "2",
        "--policies",
        "powertrip,static-optimal",
        tmp_path=tmp_path,
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data_label"] == "real"
    assert summary["config"]["workload"] == "mnist"


@pytest.mark.real_data("tinyshakespeare")
def test_shakespeare_roles_train_an_lstm_through_the_emulator(shared_data, tmp_path):
    text = shared_data / "datasets" / "tinyshakespeare" / "input.txt"
    out = tmp_path / "shakespeare"
    run_to(
        out,
        "--workload",
        "shakespeare",
        "--dataset-path",
        str(text),
        "--partition",
        "natural",
        "--num-samples",
        "3000",
        "--sites",
        "3",
        "--sweep",
        "1,3",
        "--max-rounds",
        "1",
        "--target",
        "0.99",
        "--local-steps",
        "1",
        "--policies",
        "static-optimal",
        tmp_path=tmp_path,
    )
    with (out / "rounds.csv").open() as f:
        rounds = list(csv.DictReader(f))
    assert rounds and all(0 <= float(r["accuracy"]) <= 1 for r in rounds)


def test_auto_target_is_the_lowest_best_accuracy_of_the_static_sweep(tmp_path):
    out = tmp_path / "auto"
    run_to(out, *TINY, "--target", "auto", tmp_path=tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    points = {"static-2", "static-4", "static-8"}
    with (out / "results.csv").open() as f:
        sweep = [r for r in csv.DictReader(f) if r["policy"] in points]
    best = min(float(r["best_accuracy"]) for r in sweep)
    assert summary["target_accuracy"] == pytest.approx(best, abs=1e-4)


@pytest.mark.parametrize("command", ["experiment", "curtail", "up"])
def test_a_device_that_cannot_be_used_ends_the_command_before_any_work(command, tmp_path):
    bad = "tpu" if torch.cuda.is_available() else "cuda"
    words = "use auto, cpu, cuda or cuda:N" if bad == "tpu" else "CUDA is not available"
    proc = powertrip(command, "--device", bad, "--output", str(tmp_path / "o"), tmp_path=tmp_path)
    assert proc.returncode == 2
    assert "--device" in proc.stderr and words in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and not (tmp_path / "o").exists()
