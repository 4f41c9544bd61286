"""Where the workload is the language model, both studies report its validation loss and
perplexity next to the usual columns; the synthetic corpus is labelled as such."""

from __future__ import annotations

import csv
import json
import math

from powertrip.config.curtailment import build_curtail_config
from powertrip.config.experiment import build_config
from powertrip.study.curtailment import run_curtailment_study
from powertrip.study.curtailment_report import write_curtailment_outputs
from powertrip.study.powertrip import run_study
from powertrip.study.results import write_outputs

SMALL_LM = {"workload": "lm", "n_layer": 1, "d_model": 32, "n_head": 2, "context_length": 16}


def _rows(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_the_powertrip_study_of_an_lm_reports_perplexity_per_round(tmp_path):
    cfg = build_config(
        "quick",
        **SMALL_LM,
        partition="iid",
        num_sites=2,
        num_samples=200,
        static_sweep=(1, 2),
        policies=("static-optimal",),
        max_rounds=2,
        max_local_steps=2,
        target_accuracy="auto",
    )

    write_outputs(run_study(cfg), tmp_path)

    rounds = _rows(tmp_path / "rounds.csv")
    assert all(
        math.isclose(float(r["perplexity"]), math.exp(float(r["loss"])), rel_tol=1e-3)
        for r in rounds
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["data_label"] == "synthetic (lm: embedded generated corpus)"
    assert summary["config"]["d_model"] == 32 and "model_size" not in summary["config"]  # unset
    assert {q["policy"] for q in summary["lm_quality"]} == {"static-1", "static-2"}


def test_the_curtailment_study_of_an_lm_reports_loss_and_perplexity_per_run(tmp_path):
    cfg = build_curtail_config(
        "curtailment-quick", **SMALL_LM, num_samples=160, batch_size=8, num_shards=10
    )

    study = run_curtailment_study(cfg)
    write_curtailment_outputs(study, tmp_path)

    runs = _rows(tmp_path / "runs.csv")
    assert [r["run"] for r in runs][-1] == "single-site"
    for r in runs:
        ppl, loss = float(r["final_perplexity"]), float(r["final_loss"])
        assert math.isclose(ppl, math.exp(loss), rel_tol=1e-3)
        assert float(r["best_loss"]) <= float(r["final_loss"])
    assert "perplexity" in _rows(tmp_path / "rounds.csv")[0]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["lm_quality"]) == {r["run"] for r in runs}
