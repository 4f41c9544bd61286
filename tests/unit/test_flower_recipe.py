"""The local optimizer recipe in a Flower ConfigRecord: what the server sends, each node rebuilds
exactly (``powertrip.integrations.flower.recipe``)."""

from __future__ import annotations

import pytest

from tests.needs import extra_reason

pytest.importorskip("flwr", reason=extra_reason("flower", "flwr"))

from flwr.app import ConfigRecord  # noqa: E402

from powertrip.config.recipe import LocalOptimizer  # noqa: E402
from powertrip.integrations.flower import (  # noqa: E402
    RECIPE_PREFIX,
    recipe_from_config,
    recipe_to_config,
)

FULL = LocalOptimizer(
    name="adamw",
    lr=3e-4,
    betas=(0.9, 0.99),
    eps=1e-6,
    weight_decay=0.1,
    schedule="wsd",
    warmup_steps=10,
    total_steps=500,
    min_lr_ratio=0.1,
    decay_fraction=0.3,
    clip_norm=1.0,
    keep_state=False,
)


@pytest.mark.parametrize("name", ["sgd", "momentum", "nesterov", "adamw"])
def test_every_optimizer_round_trips_through_a_config_record(name):
    recipe = LocalOptimizer(name=name, lr=0.05, momentum=0.8)
    record = ConfigRecord(recipe_to_config(recipe))  # Flower accepts every value
    assert recipe_from_config(record) == recipe


def test_a_full_recipe_round_trips_betas_schedule_and_clipping():
    flat = recipe_to_config(FULL)
    assert flat[RECIPE_PREFIX + "betas"] == [0.9, 0.99]  # a list: ConfigRecord has no tuples
    assert flat[RECIPE_PREFIX + "total_steps"] == 500
    rebuilt = recipe_from_config(ConfigRecord(flat))
    assert rebuilt == FULL and rebuilt.betas == (0.9, 0.99)


def test_unset_fields_are_left_out_and_come_back_unset():
    flat = recipe_to_config(LocalOptimizer())
    assert all(v is not None for v in flat.values())
    for field in ("lr", "total_steps", "clip_norm"):
        assert RECIPE_PREFIX + field not in flat
    rebuilt = recipe_from_config(ConfigRecord(flat))
    assert rebuilt == LocalOptimizer() and rebuilt.lr is None  # the node's own lr fills it


def test_a_record_without_the_recipe_gives_none():
    assert recipe_from_config(ConfigRecord({"server-round": 3, "lr": 0.1})) is None
    assert recipe_from_config({}) is None


def test_other_keys_of_the_record_are_ignored():
    record = ConfigRecord({"server-round": 2, **recipe_to_config(FULL)})
    assert recipe_from_config(record) == FULL


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("lr", 0.0, "greater than 0"),
        ("lr", "0.1", "valid number"),  # no string coercion: the sender's bug, said here
        ("name", "lion", "sgd"),
        ("total_steps", 2.5, "valid integer"),
        ("keep_state", 1, "valid boolean"),
        ("betas", [0.9, 1.0], "[0, 1)"),
    ],
)
def test_a_bad_value_names_its_key(key, value, problem):
    config = recipe_to_config(FULL) | {RECIPE_PREFIX + key: value}
    with pytest.raises(ValueError, match=rf"^local-optimizer\.{key}\b") as info:
        recipe_from_config(config)
    assert problem in str(info.value)


def test_a_cross_field_error_names_the_field_it_is_about():
    config = {RECIPE_PREFIX + "schedule": "cosine"}  # no total_steps
    with pytest.raises(ValueError, match=r"^local-optimizer\.total_steps: .*required"):
        recipe_from_config(config)


def test_an_unknown_recipe_key_is_refused_by_name():
    config = recipe_to_config(FULL) | {RECIPE_PREFIX + "weight-decay": 0.1}
    with pytest.raises(ValueError, match=r"^local-optimizer\.weight-decay: unknown"):
        recipe_from_config(config)
