"""Every field of each settings model is reachable from every front-end that runs it: a flag of
``powertrip experiment``, ``curtail`` and ``up``, a ``POWERTRIP_*`` variable of the services,
or an entry, with its reason, in that front-end's one exemption table. A new field that misses
a flag or a variable fails here, and so does an exemption left behind for a field that has one.
Each option's help shows its choices and its default."""

from __future__ import annotations

import enum
import types
import typing

import click
import pytest
from click.testing import CliRunner

import powertrip.services.cli.up as up_command
from powertrip.config.curtailment import CurtailmentConfig
from powertrip.config.experiment import ExperimentConfig, GreedyParams
from powertrip.config.optimizers import optimizer_names
from powertrip.config.recipe import LocalOptimizer
from powertrip.config.site_engine import SiteEngineConfig
from powertrip.services.aggregator.config import CURTAIL_RUN_LESS, AggregatorConfig
from powertrip.services.aggregator.config_run import RUN_LESS
from powertrip.services.cli.main import main
from powertrip.services.cli.model_options import CLI_LESS, CURTAIL_CLI_LESS
from powertrip.services.cli.optimizer_options import FIELDS as OPTIMIZER_FIELDS
from powertrip.services.cli.optimizer_options import OPTIMIZER_CLI_LESS, option_name
from powertrip.services.cli.up_options import UP_LESS
from powertrip.services.common.config import load_config
from powertrip.services.common.settings import library_source
from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.worker.config import SITE_ENGINE_LESS, SITE_PREFIX, WorkerConfig

AGG = {"POWERTRIP_PROFILER_ADDR": "profiler:50052", "POWERTRIP_INSECURE": "1"}


def params(command: str) -> dict[str, click.Parameter]:
    return {p.name: p for p in main.commands[command].params if p.name}


def check_reachable(model, reachable, exempt, where) -> None:  # noqa: ANN001
    """Each field of ``model`` is reachable (``reachable(field)``) or exempt, never both, and
    every exemption names a field of ``model``."""
    for name in model.model_fields:
        assert reachable(name) != (name in exempt), f"{model.__name__}.{name}: " + (
            "exempt, but reachable" if name in exempt else f"no way to set it from {where}"
        )
    assert set(exempt) <= set(model.model_fields), f"stale exemptions in {where}"
    assert all(isinstance(why, str) and why for why in exempt.values())


@pytest.mark.parametrize("command", ["experiment", "curtail", "up"])
def test_every_local_optimizer_field_is_a_flag_of_every_command_that_trains(command):
    flags = params(command)

    def own_flag(name: str) -> bool:
        return name in OPTIMIZER_FIELDS and option_name(name) in flags

    check_reachable(LocalOptimizer, own_flag, OPTIMIZER_CLI_LESS, command)
    assert "lr" in flags  # OPTIMIZER_CLI_LESS: the recipe's lr is the run's --lr


def test_every_experiment_field_is_a_flag_of_experiment():
    flags = params("experiment")
    check_reachable(ExperimentConfig, lambda n: n in flags, CLI_LESS, "experiment")
    assert set(GreedyParams.model_fields) <= set(flags)  # CLI_LESS: greedy's fields are flags


def test_every_curtailment_field_is_a_flag_of_curtail():
    flags = params("curtail")
    check_reachable(CurtailmentConfig, lambda n: n in flags, CURTAIL_CLI_LESS, "curtail")


def test_every_field_the_services_run_is_a_flag_of_up():
    flags = params("up")
    # what the aggregator takes from no variable, up sets in no other way either: its own
    # --policy and --k-star stand for the policies and the sweep
    run_less = {n: why for n, why in RUN_LESS.items() if n not in ProfilerConfig.model_fields}
    assert {"policy", "k_star", "sites", "site_ranks"} <= set(flags)
    check_reachable(ExperimentConfig, lambda n: n in flags, {**run_less, **UP_LESS}, "up")
    curtail_less = {**run_less, **CURTAIL_RUN_LESS, **UP_LESS}
    curtail_less = {n: w for n, w in curtail_less.items() if n in CurtailmentConfig.model_fields}
    curtail_less = {n: w for n, w in curtail_less.items() if n not in flags}
    check_reachable(CurtailmentConfig, lambda n: n in flags, curtail_less, "up")
    site = [n for n in SiteEngineConfig.model_fields if n not in SITE_ENGINE_LESS]
    assert {SITE_PREFIX + n for n in site} <= set(flags)  # ranks: up's own --site-ranks
    assert set(GreedyParams.model_fields) <= set(flags)


def test_every_field_the_aggregator_runs_is_a_variable():
    fields = AggregatorConfig.model_fields
    check_reachable(ExperimentConfig, lambda n: n in fields, RUN_LESS, "the aggregator's env")
    shared_less = {n: w for n, w in RUN_LESS.items() if n in CurtailmentConfig.model_fields}
    shared_less = {n: w for n, w in shared_less.items() if n not in CURTAIL_RUN_LESS}
    check_reachable(
        CurtailmentConfig,
        lambda n: n in fields,
        {**shared_less, **CURTAIL_RUN_LESS},
        "the aggregator's env (curtailment mode)",
    )


def test_what_the_aggregator_leaves_to_the_profiler_is_the_profilers():
    for name, why in {**RUN_LESS, **CURTAIL_RUN_LESS}.items():
        if "profiler's" in why:
            assert name in ProfilerConfig.model_fields, name


def test_every_site_engine_field_is_a_worker_variable():
    def derived(name: str) -> bool:
        info = WorkerConfig.model_fields.get(SITE_PREFIX + name)
        return info is not None and library_source(info) is not None

    check_reachable(SiteEngineConfig, derived, SITE_ENGINE_LESS, "the worker's env")
    assert "site_ranks" in WorkerConfig.model_fields  # ranks: the worker's own switch


# --------------------------------------------------------------------------------------------
# help: choices and defaults


def annotation_choices(annotation: object) -> list[str] | None:
    """The values a Literal or an enum annotation allows (``X | None`` as ``X``)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return annotation_choices(args[0]) if len(args) == 1 else None
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in args]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(m.value) for m in annotation]
    return None


MODELS = {
    "experiment": [ExperimentConfig, GreedyParams],
    "curtail": [CurtailmentConfig],
    "up": [ExperimentConfig, CurtailmentConfig, GreedyParams],
}


@pytest.mark.parametrize("command", ["experiment", "curtail", "up"])
def test_each_derived_option_shows_its_default_and_a_literal_its_choices(command):
    flags = params(command)
    derived = {}  # a field both models have: the first one's (up: the PowerTrip run's)
    for model in reversed(MODELS[command]):
        derived |= {n: f for n, f in model.model_fields.items() if n in flags}
    derived |= {option_name(n): LocalOptimizer.model_fields[n] for n in OPTIMIZER_FIELDS}
    assert len(derived) > 20
    for name, field in derived.items():
        option = flags[name]
        assert isinstance(option, click.Option) and option.help, name
        assert "default" in option.help.lower(), f"{command} {option.opts}: no default shown"
        assert option.default is None, name  # unset: the preset's value holds
        choices = annotation_choices(field.annotation)
        if choices is not None:
            assert list(option.type.choices) == choices, name


def test_a_default_set_by_a_preset_is_said_to_be_the_presets():
    experiment = params("experiment")
    assert "[default: the preset's]" in experiment["max_rounds"].help  # every preset sets it
    assert "[default: the preset's, else 100]" in experiment["num_sites"].help  # quick's 50
    assert "[default: 0.3]" in experiment["dirichlet_alpha"].help  # no preset sets it
    assert "[default: the preset's, else 240]" in params("curtail")["num_shards"].help
    assert "else 0.9]" in experiment["momentum"].help  # over the preset's or workload's recipe


def test_the_registries_names_are_the_choices():
    for command in ("experiment", "curtail", "up"):
        option = params(command)["optimizer"]
        assert all(n in option.type.get_metavar(option, None) for n in optimizer_names())
    assert "Known: static-optimal" in params("experiment")["policies"].help
    assert "Known: powertrip, curtailment, combined" in params("curtail")["policies"].help
    assert "int8" in params("up")["codec"].type.get_metavar(params("up")["codec"], None)


# --------------------------------------------------------------------------------------------
# flags the users type today, and values that reach the services


def test_curtails_flags_are_the_ones_users_typed():
    ctx = main.commands["curtail"].make_context(
        "curtail",
        [
            "--carbon-trace",
            "x.csv",
            "--hold",
            "30",
            "--provisioning",
            "60",
            "--round-min",
            "300",
            "--overhead",
            "10",
            "--shards",
            "20",
            "--target",
            "0.5",
            "--regions",
            "A,B",
            "--site-power",
            "0.5,1",
            "--reset-optimizer-state",
            "--betas",
            "0.9,0.99",
            "--outer-lr",
            "0.5",
            "--eval-every",
            "60",
        ],
    )
    p = ctx.params
    assert (p["hold_s"], p["provisioning_s"], p["round_min_s"]) == (30, 60, 300)
    assert (p["overhead_s"], p["num_shards"], p["target_accuracy"]) == (10, 20, 0.5)
    assert (p["regions"], p["site_power"]) == (("A", "B"), (0.5, 1.0))
    assert (p["keep_optimizer_state"], p["betas"], p["eval_every_s"]) == (False, (0.9, 0.99), 60)


class Launched(Exception):
    """Raised instead of starting the cluster: the plan it would have started."""


@pytest.fixture
def planned(monkeypatch):
    """``powertrip up ARGS`` up to the cluster it would start: its plan (nothing runs)."""

    def cluster(plan):  # noqa: ANN001, ANN202
        raise Launched(plan)

    monkeypatch.setattr(up_command, "LocalCluster", cluster)
    # up ends like Ctrl-C on SIGTERM; this process keeps its own handler
    monkeypatch.setattr(up_command.signal, "signal", lambda *_: None)

    def run(*args: str):  # noqa: ANN202
        result = CliRunner().invoke(main, ["up", *args])
        if isinstance(result.exception, Launched):
            return result.exception.args[0]
        return result

    return run


def test_ups_run_flags_reach_the_aggregators_run(planned, tmp_path):
    plan = planned(
        "--output",
        str(tmp_path),
        "--workload",
        "lm",
        "--optimizer",
        "adamw",
        "--betas",
        "0.9,0.99",
        "--momentum",
        "0.8",
        "--weight-decay",
        "0",
        "--codec",
        "int8",
        "--aggregation",
        "trimmed-mean",
        "--trim-beta",
        "0.1",
        "--k0",
        "3",
        "--lr",
        "0.01",
        "--outer",
        "nesterov",
        "--max-rounds",
        "4",
        "--batch-size",
        "8",
        "--site-seed",
        "5",
    )
    env = plan.extra_env
    run = load_config(AggregatorConfig, {**env, **AGG}).experiment()
    recipe = run.run_recipe(100)
    assert (recipe.name, recipe.betas, recipe.momentum) == ("adamw", (0.9, 0.99), 0.8)
    assert recipe.weight_decay == 0 and recipe.schedule == "cosine"  # layered on the LM's
    assert (run.codec, run.aggregation, run.trim_beta) == ("int8", "trimmed-mean", 0.1)
    assert (run.greedy.k0, run.lr, run.outer, run.max_rounds) == (3, 0.01, "nesterov", 4)
    assert run.batch_size == 8
    assert load_config(ProfilerConfig, {**env, **AGG}).site_seed == 5


def test_ups_curtailment_flags_reach_the_curtailment_run(planned, tmp_path):
    plan = planned(
        "--output",
        str(tmp_path),
        "--mode",
        "curtailment",
        "--curtail-preset",
        "curtailment-quick",
        "--sites",
        "3",
        "--optimizer",
        "adamw",
        "--shards",
        "10",
        "--eval-samples",
        "50",
        "--seed",
        "3",
        "--threshold",
        "120",
    )
    mode = {"POWERTRIP_MODE": "curtailment", "POWERTRIP_CURTAIL_PRESET": "curtailment-quick"}
    run = load_config(AggregatorConfig, {**plan.extra_env, **AGG, **mode}).curtailment()
    assert (run.local_optimizer.name, run.num_shards, run.eval_samples) == ("adamw", 10, 50)
    assert (run.seed, run.threshold) == (3, 120)


def test_ups_site_engine_flags_reach_the_workers_engine(planned, tmp_path):
    plan = planned(
        "--output",
        str(tmp_path),
        "--workers",
        "1",
        "--sites",
        "1",
        "--site-ranks",
        "2",
        "--site-sharding",
        "fsdp",
        "--site-timeout-s",
        "30",
        "--site-keep-moments",
        "false",
    )
    worker = {"POWERTRIP_AGGREGATOR_ADDR": "a:1", "POWERTRIP_SITES": "0", **AGG}
    engine = load_config(WorkerConfig, {**plan.extra_env, **worker}).site_engine
    assert (engine.ranks, engine.sharding, engine.timeout_s) == (2, "fsdp", 30)
    assert engine.keep_moments is False


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--shards", "10"], "--shards applies to --mode curtailment"),
        (["--mode", "curtailment", "--sites", "3", "--partition", "iid"], "--partition applies to"),
        (["--site-sharding", "fsdp"], "--site-sharding shapes a site's ranks"),
        (["--aggregation", "fedavg", "--clip-norm", "1"], "--clip-norm"),
        (["--momentum", "1.5"], "--momentum: Input should be less than 1"),
        (["--betas", "0.9,0.9,0.9"], "--betas"),
        (["--optimizer", "lion"], "--optimizer"),
    ],
)
def test_up_refuses_a_bad_or_ignored_flag_before_anything_starts(planned, tmp_path, args, words):
    result = planned("--output", str(tmp_path / "up"), *args)
    assert not isinstance(result, up_command.ClusterPlan), args
    assert result.exit_code == 2 and words in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_experiments_former_cli_less_fields_parse_into_its_configuration():
    from powertrip.config.experiment import build_config

    ctx = main.commands["experiment"].make_context(
        "experiment", ["--batch-size", "8", "--local-epochs", "2", "--round-trip", "true"]
    )
    given = {k: v for k, v in ctx.params.items() if k in ExperimentConfig.model_fields}
    cfg = build_config("quick", **{k: v for k, v in given.items() if v is not None})
    assert (cfg.batch_size, cfg.local_epochs, cfg.round_trip) == (8, 2, True)


def test_a_services_help_says_what_an_unset_library_setting_is():
    from powertrip.services.common.command_line import env_help

    lines = {
        line.split()[0]: line
        for line in (env_help(AggregatorConfig) + "\n" + env_help(WorkerConfig)).splitlines()
        if line.startswith("  POWERTRIP_")
    }
    assert lines["POWERTRIP_NUM_SITES"].endswith("default unset (the preset's)")
    assert lines["POWERTRIP_OUTER"].endswith("fedavg|nesterov, default unset (fedavg)")
    assert lines["POWERTRIP_SITE_SHARDING"].endswith("ddp|fsdp, default unset (ddp)")
    assert lines["POWERTRIP_NUM_SHARDS"].endswith("default unset (the preset's)")
