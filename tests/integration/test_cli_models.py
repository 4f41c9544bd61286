"""The study commands keep their models: `powertrip experiment` writes each policy's final model
and `powertrip curtail` each run's, as model files in OUTPUT/models/ that load into the
workload's model and carry the accuracy the study reported (a real process, small runs)."""

from __future__ import annotations

import csv

import pytest

from powertrip.learning.model_file import load_model, read_model_card
from tests.cli import run_powertrip

pytestmark = pytest.mark.slow


def test_experiment_writes_each_policys_final_model(tmp_path):
    out = tmp_path / "study"
    policies = "powertrip,static-optimal"
    args = ["--sites", "6", "--sweep", "3,6", "--max-rounds", "3", "--target", "0.99"]
    args += ["--num-samples", "600", "--policies", policies, "--no-plots", "--threads", "1"]

    proc = run_powertrip("experiment", *args, "--output", str(out), tmp_path=tmp_path)

    assert proc.returncode == 0, proc.stderr
    models = out / "models"
    assert f"models: {models}" in proc.stdout
    with (out / "results.csv").open() as f:
        final = {r["policy"]: float(r["final_accuracy"]) for r in csv.DictReader(f)}
    for policy in policies.split(","):
        path = models / f"{policy}-repeat-0.safetensors"
        card = read_model_card(path)
        assert (card.source, card.round) == ("experiment", 3)
        assert card.accuracy == pytest.approx(final[policy], abs=5e-5)  # the table rounds
        load_model(path)  # strict: every tensor of the workload's model
    assert not (models / ".sweep").exists()


def test_curtail_writes_each_runs_final_model(tmp_path):
    out = tmp_path / "curtail"
    args = ["--preset", "curtailment-quick", "--num-samples", "1000", "--shards", "10"]
    args += ["--policies", "curtailment", "--no-plots", "--threads", "1"]

    proc = run_powertrip("curtail", *args, "--output", str(out), tmp_path=tmp_path)

    assert proc.returncode == 0, proc.stderr
    with (out / "runs.csv").open() as f:
        runs = {r["run"]: r for r in csv.DictReader(f)}
    for name, row in runs.items():
        card = read_model_card(out / "models" / f"{name}.safetensors")
        assert card.study == "curtailment" and card.source == "curtail"
        assert card.accuracy == pytest.approx(float(row["final_accuracy"]), abs=5e-5)
    load_model(out / "models" / "curtailment.safetensors")
