"""Both study configurations take the sites' local optimizer; unset, it is the workload's
plain SGD and the configuration (summary.json) reads as before."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from powertrip.config.curtailment import CurtailmentConfig, build_curtail_config
from powertrip.config.experiment import build_config
from powertrip.config.recipe import LocalOptimizer
from powertrip.federation import StreamSetup, build_federation, load_workload


def test_unset_it_is_left_out_of_the_dumped_configuration():
    assert "local_optimizer" not in json.loads(build_config("quick").model_dump_json())
    assert "local_optimizer" not in json.loads(CurtailmentConfig().model_dump_json())


def test_a_recipe_is_validated_dumped_and_reaches_the_trainer_at_the_workloads_lr():
    cfg = build_config(
        None,
        num_sites=4,
        num_samples=400,
        local_optimizer={"name": "adamw", "weight_decay": 0.1, "clip_norm": 1.0},
    )
    dumped = json.loads(cfg.model_dump_json())["local_optimizer"]
    assert dumped["name"] == "adamw" and dumped["clip_norm"] == 1.0
    recipe = build_federation(cfg, load_workload(cfg), 0).trainer.config.recipe
    assert (recipe.name, recipe.lr, recipe.weight_decay) == ("adamw", cfg.learning_rate, 0.1)


def test_a_bad_recipe_names_its_field():
    with pytest.raises(ValidationError, match="local_optimizer.clip_norm"):
        build_config("quick", local_optimizer={"clip_norm": -1})
    with pytest.raises(ValidationError, match="local_optimizer.name"):
        CurtailmentConfig(local_optimizer={"name": "lion"})


def test_adamw_without_an_lr_takes_its_own_default_not_the_workloads_sgd_rate():
    adamw = {"name": "adamw"}
    assert build_config(None, workload="lm", local_optimizer=adamw).learning_rate == 2e-3
    assert build_config(None, local_optimizer=adamw).learning_rate == 1e-3  # mnist1d
    assert build_config(None, local_optimizer={"name": "momentum"}).learning_rate == 0.2
    assert build_config(None, workload="lm", lr=5e-4, local_optimizer=adamw).learning_rate == 5e-4


def test_the_lm_curtailment_preset_trains_adamw_and_flags_layer_on_it():
    preset = build_curtail_config("curtailment").local_optimizer
    assert preset is not None and preset.name == "adamw" and preset.clip_norm == 1.0
    reset = build_curtail_config(
        "curtailment", local_optimizer=LocalOptimizer(keep_state=False)
    ).local_optimizer  # --reset-optimizer-state alone keeps the preset's AdamW
    assert reset == preset.model_copy(update={"keep_state": False})
    sgd = build_curtail_config("curtailment", local_optimizer=LocalOptimizer(name="sgd"))
    assert sgd.local_optimizer == LocalOptimizer(name="sgd")  # no AdamW decay or clipping
    assert build_curtail_config("curtailment-quick").local_optimizer is None  # mnist1d: SGD


def test_a_schedule_longer_than_the_run_is_refused_naming_the_field():
    cosine = {"name": "adamw", "schedule": "cosine", "total_steps": 10_000}
    cfg = build_config(None, num_sites=4, num_samples=400, max_rounds=3, local_optimizer=cosine)
    # 80 samples per site at batch 20: 4 steps a round, 12 in 3 rounds
    with pytest.raises(ValueError, match=r"total_steps \(10000\) is longer than the run.* 12 "):
        build_federation(cfg, load_workload(cfg), 0)
    fits = build_config(
        None,
        num_sites=4,
        num_samples=400,
        max_rounds=3,
        local_optimizer={**cosine, "total_steps": 12},
    )
    build_federation(fits, load_workload(fits), 0)
    stream = {**cosine, "total_steps": 10**6}
    with pytest.raises(ValueError, match="longer than the run.*the whole stream"):
        StreamSetup.load(CurtailmentConfig(num_samples=1000, local_optimizer=stream))
