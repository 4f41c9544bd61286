"""Absurd local optimizer values are refused where the recipe is declared (``LocalOptimizer``),
so every way of giving one (POWERTRIP_LOCAL_OPTIMIZER, the CLI flags, a preset, a workload's
lr) meets the same bounds: each value past them makes every update NaN or wipes the model at
the first step."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from powertrip.config.recipe import MAX_LR, LocalOptimizer
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.cli.main import main as powertrip
from powertrip.services.common.config import ConfigError, load_config

AGG = {"POWERTRIP_PROFILER_ADDR": "profiler:50052", "POWERTRIP_INSECURE": "1"}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"lr": 1e30}, "lr"),
        ({"weight_decay": 1e30}, "weight_decay"),
        ({"eps": 1e-300}, "eps"),
        ({"eps": 0.0}, "eps"),
        ({"momentum": 1.0}, "momentum"),
        ({"momentum": -0.1}, "momentum"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"betas": (-0.1, 0.9)}, "betas"),
    ],
)
def test_absurd_values_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValidationError, match=field):
        LocalOptimizer(name="adamw", **kwargs)


def test_usual_values_pass_the_bounds():
    LocalOptimizer(name="adamw", lr=6e-4, eps=1e-8, weight_decay=0.1, betas=(0.9, 0.95))
    LocalOptimizer(name="nesterov", lr=0.8, momentum=0.99, weight_decay=5e-4)
    LocalOptimizer(name="sgd", lr=MAX_LR)


def test_a_decay_that_zeroes_or_flips_the_weights_each_step_is_refused():
    with pytest.raises(ValidationError, match="lr x weight_decay must be below 1"):
        LocalOptimizer(lr=2.0, weight_decay=0.5)
    LocalOptimizer(lr=1.0, weight_decay=0.9)


def test_an_lr_filled_in_later_meets_the_same_bounds_in_one_line():
    with pytest.raises(ValueError, match=r"^lr 1e\+30: Input should be less than or equal to 10$"):
        LocalOptimizer().with_lr(1e30)
    with pytest.raises(ValueError, match=r"^lr 4: lr x weight_decay must be below 1"):
        LocalOptimizer(weight_decay=0.5).with_lr(4)
    assert LocalOptimizer(weight_decay=0.1).with_lr(0.2).lr == 0.2


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        ('{"name": "adamw", "lr": 1e30}', "lr: Input should be less than or equal to 10"),
        ('{"name": "adamw", "weight_decay": 1e30}', "weight_decay: Input should be less than"),
        ('{"name": "adamw", "eps": 1e-300}', "eps: must be at least 1e-30, got 1e-300"),
        ('{"name": "momentum", "momentum": 1.5}', "momentum: Input should be less than 1"),
        ('{"name": "adamw", "betas": [0.9, 1.0]}', r"betas must each be in \[0, 1\)"),
    ],
)
def test_the_service_setting_names_the_variable_its_value_and_the_field(recipe, message):
    env = {**AGG, "POWERTRIP_LOCAL_OPTIMIZER": recipe}
    with pytest.raises(ConfigError) as exc:
        load_config(AggregatorConfig, env)
    line = str(exc.value)
    assert line.startswith(f"POWERTRIP_LOCAL_OPTIMIZER={recipe!r}: ") and "\n" not in line
    assert exc.match(message)


def test_the_cli_flag_is_refused_in_one_line_naming_it(tmp_path):
    args = ["experiment", "--optimizer", "adamw", "--weight-decay", "1e30"]
    result = CliRunner().invoke(powertrip, [*args, "--output", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "--weight-decay: Input should be less than or equal to 1" in result.stderr
