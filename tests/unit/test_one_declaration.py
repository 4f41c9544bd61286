"""One declaration per setting: the services' variables are the library's field names, their
help is the fields' descriptions, and ``powertrip experiment``'s options are derived from
``ExperimentConfig`` (issue "Fit the ecosystem", item "One declaration per setting")."""

from __future__ import annotations

import logging
import types
import typing

import pytest

from powertrip.config.curtailment import CurtailmentConfig
from powertrip.config.experiment import ExperimentConfig, GreedyParams
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.cli.main import main
from powertrip.services.cli.model_options import CLI_LESS, EXPERIMENT_FLAGS
from powertrip.services.common.command_line import env_help
from powertrip.services.common.config import ConfigError, env_name, load_config
from powertrip.services.common.settings import CurtailSettings, library_source, renamed_to
from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.worker.config import WorkerConfig

SERVICES = [AggregatorConfig, ProfilerConfig, WorkerConfig]
AGG = {"POWERTRIP_PROFILER_ADDR": "profiler:50052", "POWERTRIP_INSECURE": "1"}
PROFILER = {"POWERTRIP_INSECURE": "1"}


def members(annotation: object) -> tuple[object, ...]:
    """``A | B | None`` -> (A, B): what a value may be, whether or not it may be unset."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return (annotation,)


def library_backed(config: type) -> dict[str, object]:
    out = {}
    for name, info in config.model_fields.items():
        if (source := library_source(info)) is not None:
            out[name] = source
    return out


@pytest.mark.parametrize("config", SERVICES, ids=lambda c: c.__name__)
def test_every_variable_in_the_help_has_a_description(config):
    text = env_help(config)
    for name, info in config.model_fields.items():
        assert info.description, f"{env_name(name)} has no description"
        assert env_name(name) in text
        assert info.description.split()[0] in text


@pytest.mark.parametrize("config", [AggregatorConfig, ProfilerConfig], ids=lambda c: c.__name__)
def test_a_library_backed_variable_is_the_library_field_of_the_same_name(config):
    backed = library_backed(config)
    assert backed, "the service reads no library field"
    for name, source in backed.items():
        assert source.name == name  # POWERTRIP_ + the library's field name, upper-cased
        lib = source.model.model_fields[name]
        ours = config.model_fields[name]
        assert ours.description == lib.description
        assert set(members(ours.annotation)) == set(members(lib.annotation)), name


def test_the_aggregators_run_settings_mirror_no_library_field_by_hand():
    mirrored = set(ExperimentConfig.model_fields) & set(AggregatorConfig.model_fields)
    assert mirrored - set(library_backed(AggregatorConfig)) == set()
    curtail = set(CurtailmentConfig.model_fields) & set(CurtailSettings.model_fields)
    assert curtail <= set(library_backed(CurtailSettings))
    assert {"regions", "threshold", "hold_s", "hours"} <= curtail


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("POWERTRIP_THRESHOLD", "-1", "greater than 0"),
        ("POWERTRIP_HOURS", "inf", "finite number"),
        ("POWERTRIP_NUM_SAMPLES", "10", "greater than or equal to 100"),
        ("POWERTRIP_TRIM_BETA", "0.7", "POWERTRIP_TRIM_BETA"),
        ("POWERTRIP_OUTER_MOMENTUM", "1", "less than 1"),
    ],
)
def test_the_library_constraints_refuse_a_bad_variable_at_start(variable, value, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(AggregatorConfig, {**AGG, variable: value})
    assert str(info.value).startswith(f"{variable}={value!r}")


def test_variables_reach_the_run_under_the_library_names():
    env = {
        **AGG,
        "POWERTRIP_MODE": "curtailment",
        "POWERTRIP_CURTAIL_PRESET": "curtailment-quick",
        "POWERTRIP_REGIONS": "region-1, region-0",
        "POWERTRIP_THRESHOLD": "150",
        "POWERTRIP_HOLD_S": "30",
        "POWERTRIP_HOURS": "6",
    }
    c = load_config(AggregatorConfig, env).curtailment()
    assert (c.regions, c.threshold, c.hold_s, c.hours) == (("region-1", "region-0"), 150, 30, 6)
    exp = load_config(
        AggregatorConfig, {**AGG, "POWERTRIP_NUM_SITES": "7", "POWERTRIP_OUTER": "nesterov"}
    ).experiment()
    assert (exp.num_sites, exp.outer, exp.name) == (7, "nesterov", "quick")


def test_an_empty_override_leaves_the_presets_value():
    exp = load_config(AggregatorConfig, {**AGG, "POWERTRIP_NUM_SITES": ""}).experiment()
    assert exp.num_sites == 50  # the quick preset's


OLD_NAMES = {
    "POWERTRIP_SITE_REGIONS": ("POWERTRIP_REGIONS", "region-2,region-0", ("region-2", "region-0")),
    "POWERTRIP_CURTAIL_THRESHOLD": ("POWERTRIP_THRESHOLD", "150", 150.0),
    "POWERTRIP_CURTAIL_HOLD_S": ("POWERTRIP_HOLD_S", "30", 30.0),
    "POWERTRIP_CURTAIL_HOURS": ("POWERTRIP_HOURS", "6", 6.0),
}


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_a_deprecated_name_still_works_and_warns(old, caplog):
    new, value, parsed = OLD_NAMES[old]
    with caplog.at_level(logging.WARNING):
        cfg = load_config(ProfilerConfig, {**PROFILER, old: value})
    field = new.removeprefix("POWERTRIP_").lower()
    assert getattr(cfg, field) == parsed
    assert getattr(cfg, old.removeprefix("POWERTRIP_").lower()) is None  # moved, not kept
    (record,) = [r for r in caplog.records if old in r.getMessage()]
    assert record.levelno == logging.WARNING and new in record.getMessage()


def test_a_deprecated_name_next_to_its_new_one_is_refused():
    env = {**PROFILER, "POWERTRIP_CURTAIL_THRESHOLD": "150", "POWERTRIP_THRESHOLD": "120"}
    with pytest.raises(ConfigError, match="POWERTRIP_CURTAIL_THRESHOLD is the old name"):
        load_config(ProfilerConfig, env)


def test_every_deprecated_name_says_its_new_one_in_the_help():
    text = env_help(ProfilerConfig)
    for name, info in CurtailSettings.model_fields.items():
        if (new := renamed_to(info)) is not None:
            assert new in CurtailmentConfig.model_fields
            assert env_name(name) in text and f"old name of {env_name(new)}" in text


# --------------------------------------------------------------------------------------------
# powertrip experiment


def experiment_params() -> dict[str, object]:
    return {p.name: p for p in main.commands["experiment"].params}


def test_every_experiment_field_has_an_option_or_is_deliberately_cli_less():
    params = experiment_params()
    for name in ExperimentConfig.model_fields:
        assert (name in params) != (name in CLI_LESS), name
    for name in GreedyParams.model_fields:  # flattened into flags of their own
        assert name in params


def test_each_option_is_named_as_users_type_it_and_explained_by_the_field():
    params = experiment_params()
    for name, info in ExperimentConfig.model_fields.items():
        if name in CLI_LESS:
            continue
        flag = EXPERIMENT_FLAGS.get(name, "--" + name.replace("_", "-"))
        assert params[name].opts == [flag]
        # the field's description, then (for a registry's names) the names it knows
        assert info.description and params[name].help.startswith(info.description)
        assert not params[name].required  # not given: the preset's value holds


@pytest.mark.parametrize(
    ("name", "choices"),
    [
        ("partition", ["iid", "dirichlet", "natural"]),
        ("distance_mode", ["stratified", "uniform"]),
        ("ground_truth", ["per-site-max", "aggregate"]),
        ("outer", ["fedavg", "nesterov"]),
        ("power_model", ["uniform", "synthetic-trace", "google-trace"]),
    ],
)
def test_choices_come_from_the_models_literal_or_enum(name, choices):
    assert list(experiment_params()[name].type.choices) == choices


def test_the_readme_flags_still_parse_into_the_configuration():
    ctx = main.commands["experiment"].make_context(
        "experiment",
        [
            "--preset",
            "quick",
            "--partition",
            "dirichlet",
            "--dirichlet-alpha",
            "0.3",
            "--threads",
            "1",
            "--max-rounds",
            "5",
            "--repeats",
            "2",
            "--update-gb",
            "2",
            "--sites",
            "8",
            "--sweep",
            "2,4",
            "--target",
            "auto",
            "--k0",
            "3",
        ],
    )
    p = ctx.params
    assert (p["partition"], p["dirichlet_alpha"], p["max_rounds"]) == ("dirichlet", 0.3, 5)
    assert (p["repeats"], p["update_gb"], p["num_sites"]) == (2, 2.0, 8)
    assert (p["static_sweep"], p["target_accuracy"], p["k0"]) == ((2, 4), "auto", 3)
