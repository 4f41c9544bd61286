"""A run that names no optimizer trains its workload's default, declared once in
``powertrip.config.workload_defaults``: for the LM the library's measured AdamW recipe
(docs/workloads.md), its warm-up and cosine fitted to the run's own length; a user's flags
still override it, and the curtailment preset reads the same declaration."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from powertrip.config.curtailment import build_curtail_config
from powertrip.config.experiment import ExperimentConfig, build_config
from powertrip.config.recipe import LocalOptimizer
from powertrip.config.workload_defaults import LM_RECIPE, RunRecipe
from powertrip.federation import build_federation, load_workload

SMALL_LM = {"workload": "lm", "n_layer": 1, "d_model": 32, "n_head": 2, "context_length": 16}


def test_the_lm_trains_the_measured_adamw_recipe_fitted_to_the_documented_budget():
    cfg = build_config("quick", workload="lm")

    recipe = cfg.run_recipe(2000)  # 1 site x 2,000 steps of 12 windows

    assert cfg.local_optimizer == LM_RECIPE and cfg.local_batch_size == 12
    assert cfg.learning_rate == 2e-3 and cfg.partition == "iid"  # not quick's label skew
    assert recipe == LocalOptimizer(
        name="adamw",
        betas=(0.9, 0.99),
        weight_decay=0.1,
        clip_norm=1.0,
        keep_state=True,
        schedule="cosine",
        warmup_steps=100,
        total_steps=2000,
        min_lr_ratio=0.05,
    )


def test_the_schedule_spans_whatever_rounds_x_local_steps_the_run_has():
    cfg = build_config(
        "quick", **SMALL_LM, num_sites=2, num_samples=200, max_rounds=3, max_local_steps=4
    )

    recipe = build_federation(cfg, load_workload(cfg), 0).trainer.config.recipe

    assert (recipe.name, recipe.lr, recipe.schedule) == ("adamw", 2e-3, "cosine")
    assert (recipe.total_steps, recipe.warmup_steps) == (3 * 4, 1)


def test_flags_override_the_lm_recipe():
    def lm(**flags: object) -> ExperimentConfig:
        return build_config("quick", workload="lm", **flags)

    sgd = lm(local_optimizer=LocalOptimizer(name="sgd"))  # --optimizer sgd
    assert sgd.local_optimizer == LocalOptimizer(name="sgd") and sgd.learning_rate == 0.1
    faster = lm(lr=4e-3)  # --lr: the recipe's peak lr, its schedule unchanged
    assert faster.learning_rate == 4e-3 and faster.local_optimizer == LM_RECIPE
    undecayed = lm(local_optimizer=LocalOptimizer(weight_decay=0.0))  # --weight-decay 0
    assert isinstance(undecayed.local_optimizer, RunRecipe)
    assert undecayed.run_recipe(50).weight_decay == 0 and undecayed.run_recipe(50).betas[1] == 0.99
    constant = lm(local_optimizer=LocalOptimizer(schedule="constant"))  # --lr-schedule constant
    assert constant.run_recipe(50) == LM_RECIPE.optimizer.model_copy(
        update={"schedule": "constant"}
    )


def test_other_workloads_keep_plain_sgd_and_summaries_as_before():
    cfg = build_config("quick")
    assert cfg.local_optimizer is None and cfg.run_recipe(100) is None
    assert (cfg.learning_rate, cfg.local_batch_size) == (0.2, 20)  # mnist1d


def test_the_recipe_reaches_a_worker_unchanged_through_the_configs_json():
    cfg = build_config("quick", workload="lm", local_optimizer=LocalOptimizer(clip_norm=0.5))

    again = ExperimentConfig.model_validate_json(cfg.model_dump_json())

    assert again == cfg and again.run_recipe(300) == cfg.run_recipe(300)


def test_the_lm_takes_no_split_but_iid():
    with pytest.raises(ValidationError, match="no labels or groups to split by: --partition iid"):
        build_config("quick", workload="lm", partition="dirichlet")


def test_the_curtailment_preset_reads_the_same_recipe_with_its_measured_constant_lr():
    preset = build_curtail_config("curtailment").local_optimizer

    assert preset == LM_RECIPE.fit(200, schedule="constant")
    # the fields it stated by hand before, so its documented figures still hold
    assert preset is not None and preset.model_dump(
        include={"name", "lr", "betas", "weight_decay", "warmup_steps", "clip_norm", "schedule"}
    ) == {
        "name": "adamw",
        "lr": None,
        "betas": (0.9, 0.99),
        "weight_decay": 0.1,
        "warmup_steps": 10,
        "clip_norm": 1.0,
        "schedule": "constant",
    }
