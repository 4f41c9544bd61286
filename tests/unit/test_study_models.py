"""A study keeps the final model of each policy's run, as a model file per policy and repeat
(powertrip/study/models.py), written as the run finishes."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from powertrip.config.experiment import build_config
from powertrip.learning.custom import declared_workload
from powertrip.learning.model_file import ModelSpec, load_model, read_model_card
from powertrip.rounds.emulate import EmulatedRun
from powertrip.study.models import MODELS_DIR, ModelLog, RunModels
from powertrip.study.powertrip import run_study


def test_each_policys_final_model_is_written_and_static_optimal_is_the_sweeps_k_star(tmp_path):
    cfg = build_config(
        "quick",
        num_sites=6,
        num_samples=600,
        static_sweep=(3, 6),
        policies=("powertrip", "static-optimal"),
        max_rounds=3,
        target_accuracy=0.99,
    )
    log = ModelLog(RunModels(cfg, tmp_path, "experiment"), cfg.policies)

    result = run_study(cfg, device="cpu", keep_models=True, log=log)

    models = tmp_path / MODELS_DIR
    assert sorted(p.name for p in models.iterdir()) == [
        "powertrip-repeat-0.json",
        "powertrip-repeat-0.safetensors",
        "static-optimal-repeat-0.json",
        "static-optimal-repeat-0.safetensors",
    ]
    for policy in ("powertrip", "static-optimal"):
        path = models / f"{policy}-repeat-0.safetensors"
        kept = result.model(policy, 0)
        loaded = load_model(path).state_dict()
        assert all(torch.equal(loaded[k], kept[k]) for k in kept)
        card = read_model_card(path)
        summary = next(s for s in result.summaries if s.policy == policy)
        assert (card.round, card.accuracy) == (summary.rounds_run, summary.final_accuracy)
    assert (
        read_model_card(models / "static-optimal-repeat-0.json").policy == f"static-{result.k_star}"
    )


def test_the_sweeps_models_become_static_optimal_whatever_a_kill_left_behind(tmp_path):
    log = ModelLog(RunModels(build_config("quick"), tmp_path, "experiment"), ["static-optimal"])
    aside = tmp_path / MODELS_DIR / ModelLog.SWEEP
    aside.mkdir(parents=True)
    for name in ("static-3-repeat-0", "static-6-repeat-0", "static-3-repeat-1"):
        for suffix in (".safetensors", ".json"):
            (aside / (name + suffix)).write_text(name)
    (aside / "static-6-repeat-1.safetensors.tmp").write_text("cut short")

    log.scored(SimpleNamespace(k_star=3), [])

    models = tmp_path / MODELS_DIR
    assert sorted(p.name for p in models.iterdir()) == [
        "static-optimal-repeat-0.json",
        "static-optimal-repeat-0.safetensors",
        "static-optimal-repeat-1.json",
        "static-optimal-repeat-1.safetensors",
    ]
    assert (models / "static-optimal-repeat-1.json").read_text() == "static-3-repeat-1"


def test_a_runs_model_is_on_disk_before_the_run_is_on_record(tmp_path):
    """A kill between the two leaves a run to compute again, never a recorded run whose model
    a resume could not write."""
    spec = ModelSpec("mnist1d", "image", 10, (1, 40), "float32")
    model = declared_workload("mnist1d").build_model(spec.shape_only())
    run = EmulatedRun("powertrip", 0, None, model=model.state_dict())
    path = tmp_path / MODELS_DIR / "powertrip-repeat-0.safetensors"
    on_disk_when_recorded = []

    class Record:
        def recorded(self, repeat, policy):
            return None

        def finished(self, result, repeat, run, cache, computed):
            on_disk_when_recorded.append(path.exists())

        def scored(self, result, summaries):
            pass

    models = RunModels(build_config("quick"), tmp_path, "experiment", spec)
    ModelLog(models, ["powertrip"], Record()).finished(None, 0, run, (0, 0), computed=True)

    assert on_disk_when_recorded == [True]
