"""``powertrip up``'s options for what the services run: one flag per service setting that is a
library field (the aggregator's PowerTrip run, the curtailment run's own fields and its sites'
availability, the profiler's site model, the worker's site engine), derived from the library's
model like ``powertrip experiment``'s (``model_options``), plus the optimizer flags and
Algorithm 1's. A flag given becomes that setting's ``POWERTRIP_<SETTING>`` in every service's
environment (each reads its own); one not given leaves the service's default, the preset's.

So a field the services read is a flag here as soon as it is a variable there; ``UP_LESS`` lists
the ones ``up`` sets in another way.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel, ValidationError

from powertrip.config.curtailment import CURTAIL_PRESETS, CurtailmentConfig
from powertrip.config.experiment import ExperimentConfig, GreedyParams
from powertrip.config.presets import PRESETS
from powertrip.config.site_engine import SiteEngineConfig
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.cli.common import describe_validation, fail
from powertrip.services.cli.model_options import (
    CURTAIL_FLAGS,
    EXPERIMENT_FLAGS,
    EXPERIMENT_NOTES,
    FIELD_TYPES,
    default_text,
    model_options,
    policys_own,
    preset_defaults,
)
from powertrip.services.cli.optimizer_options import optimizer_options
from powertrip.services.common.settings import env_name, library_source
from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.worker.config import SITE_PREFIX, WorkerConfig

__all__ = ["FLAGS", "SETTINGS", "UP_FLAGS", "UP_LESS", "Setting", "service_env", "up_options"]

ACCURACY = click.FloatRange(0, 1, min_open=True)  # (0, 1]


@dataclass(frozen=True)
class Setting:
    """A service setting that is ``model``'s field ``field``, read first by ``service``."""

    name: str
    model: type[BaseModel]
    field: str
    service: str


def _settings() -> dict[str, Setting]:
    out: dict[str, Setting] = {}
    for service, config in (
        ("aggregator", AggregatorConfig),
        ("profiler", ProfilerConfig),
        ("worker", WorkerConfig),
    ):
        for name, info in config.model_fields.items():
            source = library_source(info)
            if source is not None and name not in out:
                out[name] = Setting(name, source.model, source.name, service)
    return out


#: every service setting that is a library field, by its name (POWERTRIP_ + the name)
SETTINGS = _settings()

#: settings ``up`` sets in another way than their own flag, and how.
UP_LESS = {
    "num_sites": "--sites, up's own: it splits the sites over --workers (default 12)",
    "local_optimizer": "the optimizer flags (optimizer_options), as one recipe",
    "greedy": "Algorithm 1's flags (--k0, --window, ...), as one object",
}

#: a setting's flag: as ``experiment`` and ``curtail`` name it, and ``--samples`` as before
UP_FLAGS = {**EXPERIMENT_FLAGS, **CURTAIL_FLAGS, "num_samples": "--samples"}

_UP_TYPES: dict[str, click.ParamType] = {
    **FIELD_TYPES,
    "target_accuracy": ACCURACY,  # one run: no sweep to take the automatic target from
    "num_samples": click.IntRange(100),
    # every service process reads the data at this path
    "dataset_path": click.Path(exists=True, path_type=Path, resolve_path=True),
}


def _group(service: str, model: type[BaseModel]) -> list[str]:
    return [
        s.name
        for s in SETTINGS.values()
        if s.service == service and s.model is model and s.name not in UP_LESS
    ]


def _own_default(config: type[BaseModel]) -> Callable[[str], str | None]:
    """The service setting's own default (the profiler's site model presets nothing)."""
    return lambda name: default_text(config.model_fields[name])


def _site_flag(name: str) -> str:
    return "--site-" + name.replace("_", "-")


def up_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Every setting of ``SETTINGS`` not in ``UP_LESS`` as a flag, then Algorithm 1's and the
    optimizer's; the command receives them by setting name (``service_env`` pops them)."""
    site_fields = [s.field for s in SETTINGS.values() if s.model is SiteEngineConfig]
    decorators = [
        model_options(
            ExperimentConfig,
            _group("aggregator", ExperimentConfig),
            UP_FLAGS,
            _UP_TYPES,
            default=preset_defaults(ExperimentConfig, PRESETS, EXPERIMENT_NOTES),
            helps={"target_accuracy": "Target accuracy, in (0, 1]."},
        ),
        model_options(
            CurtailmentConfig,
            _group("aggregator", CurtailmentConfig),
            UP_FLAGS,
            _UP_TYPES,
            default=preset_defaults(
                CurtailmentConfig, CURTAIL_PRESETS, whose="the --curtail-preset's"
            ),
        ),
        model_options(
            ExperimentConfig,
            _group("profiler", ExperimentConfig),
            UP_FLAGS,
            _UP_TYPES,
            default=_own_default(ProfilerConfig),
        ),
        model_options(
            SiteEngineConfig,
            site_fields,
            {n: _site_flag(n) for n in site_fields},
            default=lambda n: default_text(SiteEngineConfig.model_fields[n]),
            dest=lambda n: SITE_PREFIX + n,
        ),
        model_options(GreedyParams, GreedyParams.model_fields, default=policys_own),
        optimizer_options,
    ]
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


def env_text(value: object) -> str:
    """A value as its variable holds it (``LibraryValue`` reads it back): a model as the JSON
    of the fields set (a recipe layers on the preset's by them), a dict as JSON, a tuple
    comma-separated, a path absolute (the services may start elsewhere)."""
    if isinstance(value, BaseModel):
        return value.model_dump_json(exclude_unset=True)
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, tuple):
        return ",".join(env_text(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, Path):
        return str(value.resolve())
    return str(value)


def _mode_of(setting: Setting) -> str | None:
    """The mode the aggregator reads a setting in, when only one (None: both, or another
    service's setting)."""
    if setting.service != "aggregator":
        return None
    ours = setting.field in ExperimentConfig.model_fields
    theirs = setting.field in CurtailmentConfig.model_fields
    return None if ours == theirs else ("powertrip" if ours else "curtailment")


def service_env(options: dict[str, object], run: Mapping[str, object]) -> dict[str, str]:
    """Pop the settings' flags from ``options``: the variables of those given, checked as the
    services will check them (``run``: ``up``'s own options), or the command's one-line error
    naming the flag. A flag the run's mode would ignore is refused, not dropped."""
    greedy = {k: v for k in GreedyParams.model_fields if (v := options.pop(k, None)) is not None}
    given = {n: v for n in SETTINGS if n in options and (v := options.pop(n)) is not None}
    if greedy:
        given["greedy"] = greedy
    for name in given:
        mode = _mode_of(SETTINGS[name])
        if mode is not None and mode != run["mode"]:
            fail(f"{FLAGS[name]} applies to --mode {mode}, not {run['mode']}")
    site = [n for n in given if SETTINGS[n].model is SiteEngineConfig]
    if site and not run["site_ranks"]:
        fail(f"{FLAGS[site[0]]} shapes a site's ranks: it needs --site-ranks N")
    _check(given, run)
    return {env_name(n): env_text(v) for n, v in given.items()}


def _check(given: Mapping[str, object], run: Mapping[str, object]) -> None:
    """Build what each service builds from these values (the aggregator's run in its mode, the
    profiler's site model, the worker's site engine), so a bad combination ends the command
    before any service starts, named by its flags."""
    of: dict[str, dict[str, object]] = {"aggregator": {}, "profiler": {}, "worker": {}}
    for name, value in given.items():
        of[SETTINGS[name].service][name] = value
    sites = {"num_sites": run["sites"]}
    try:
        agg = AggregatorConfig.model_validate(
            {**_aggregator_own(run), **sites, **of["aggregator"], **_PLAIN, "checkpoint_dir": ""}
        )
        agg.build_curtailment() if run["mode"] == "curtailment" else agg.build_experiment()
        ProfilerConfig.model_validate({**sites, **of["profiler"], **_PLAIN})
        if run["site_ranks"]:
            site = {SETTINGS[n].field: v for n, v in of["worker"].items()}
            SiteEngineConfig.model_validate({**site, "ranks": run["site_ranks"]})
    except ValidationError as exc:
        fail(describe_validation(exc, "run configuration", _ERROR_FLAGS, {"greedy"}))


#: what ``_check`` gives a service besides the run (never a port or a certificate: plaintext)
_PLAIN = {"insecure": True}
#: ``up``'s own options that are aggregator settings under another name
_OWN = {
    k: "--" + k.replace("_", "-")
    for k in ("mode", "preset", "curtail_preset", "policy", "k_star", "clock", "pace")
}


def _aggregator_own(run: Mapping[str, object]) -> dict[str, object]:
    return {k: run[k] for k in _OWN if run.get(k) is not None} | {"profiler_addr": "-"}


#: how a validation error names each setting (and each site engine field): its flag
FLAGS = {
    n: _site_flag(s.field)
    if s.model is SiteEngineConfig
    else UP_FLAGS.get(n, "--" + n.replace("_", "-"))
    for n, s in SETTINGS.items()
} | {"num_sites": "--sites", "greedy": "--k0 ...", "local_optimizer": "--optimizer ..."}
_ERROR_FLAGS = (
    FLAGS | _OWN | {s.field: FLAGS[n] for n, s in SETTINGS.items() if s.model is SiteEngineConfig}
)
