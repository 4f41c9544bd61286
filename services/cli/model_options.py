"""Command-line options derived from a configuration model: one ``--flag`` per field, with the
field's name as the parameter, its type (choices from a ``Literal`` or an enum, comma lists for
tuples, a registry's names), and as help its ``description``, the names a registry knows and
the default. Every option defaults to unset, so a flag not given leaves the preset's value; the
help says so (``[default: the preset's]``) where a preset sets the field, and shows the field's
own default otherwise.

``experiment_options`` is ``powertrip experiment``'s set: every ``ExperimentConfig`` field but
those in ``CLI_LESS``, under the flag names users already type (``EXPERIMENT_FLAGS``);
``curtail`` derives its set from ``CurtailmentConfig`` the same way (``CURTAIL_CLI_LESS``).
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from powertrip.codecs import codec_names, get_codec
from powertrip.config.curtailment import CURTAIL_POLICIES, CURTAIL_PRESETS, CurtailmentConfig
from powertrip.config.experiment import ExperimentConfig, GreedyParams
from powertrip.config.presets import PRESETS
from powertrip.selection.registry import known_policy_names, validate_policy_name
from powertrip.services.cli.common import CommaList, RegisteredName, RegisteredNames, WorkloadName

__all__ = [
    "CLI_LESS",
    "CURTAIL_CLI_LESS",
    "CURTAIL_FLAGS",
    "EXPERIMENT_FLAGS",
    "EXPERIMENT_NOTES",
    "FIELD_TYPES",
    "TargetAccuracy",
    "curtail_options",
    "default_text",
    "experiment_options",
    "flag_for",
    "model_options",
    "policys_own",
    "preset_defaults",
]

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]
#: a field's name -> what its help says the default is (None: nothing to add)
DefaultNote = Callable[[str], str | None]


class TargetAccuracy(click.ParamType):
    """A number, or ``auto`` for the paper's rule: the lowest best accuracy of the static sweep."""

    name = "FLOAT|auto"

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        if isinstance(value, float) or value == "auto":
            return value
        try:
            return float(value)
        except ValueError:
            self.fail(f"{value!r} is neither a number nor 'auto'", param, ctx)


#: Fields whose flag is not ``--`` + the name with dashes (so validation errors name the flag
#: the user typed, too).
EXPERIMENT_FLAGS = {
    "num_sites": "--sites",
    "target_accuracy": "--target",
    "ideal_compute_s": "--tau",
    "static_sweep": "--sweep",
    "power_trace_path": "--power-trace",
    "max_local_steps": "--local-steps",
}

#: ``ExperimentConfig`` fields with no option of their own, and why.
CLI_LESS = {
    "name": "the preset's name (--preset), or 'custom'",
    "description": "the preset's description",
    "tokenizer_sha256": "filled in by the aggregator for its workers",
    "greedy": "its fields are flags of their own (--k0, --window, ...)",
    "local_optimizer": "its fields are the optimizer flags (optimizer_options)",
}

#: ``CurtailmentConfig`` fields whose flag is not ``--`` + the name with dashes.
CURTAIL_FLAGS = {
    "carbon_trace_path": "--carbon-trace",
    "hold_s": "--hold",
    "provisioning_s": "--provisioning",
    "round_min_s": "--round-min",
    "overhead_s": "--overhead",
    "eval_every_s": "--eval-every",
    "num_shards": "--shards",
    "target_accuracy": "--target",
}

#: ``CurtailmentConfig`` fields with no option of their own, and why.
CURTAIL_CLI_LESS = {
    "name": "the preset's name (--preset)",
    "description": "the preset's description",
    "tokenizer_sha256": "filled in by the aggregator for its workers",
    "local_optimizer": "its fields are the optimizer flags (optimizer_options)",
}

#: Parameter types a field's annotation does not say: a checked workload name, 'auto' as a
#: target, the registries' names, and the LM's sizes refused by click as before.
FIELD_TYPES: dict[str, click.ParamType] = {
    "workload": WorkloadName(),
    "policies": RegisteredNames(known_policy_names, validate_policy_name),
    "codec": RegisteredName(codec_names, get_codec),
    "target_accuracy": TargetAccuracy(),
    **{n: click.IntRange(min=1) for n in ("n_layer", "n_head", "d_model", "context_length")},
}

#: ``curtail``'s: its two workloads, and its policies checked by the model (so a bad one is
#: reported on one line with every other bad value).
_CURTAIL_TYPES: dict[str, click.ParamType] = {
    **FIELD_TYPES,
    "workload": click.Choice(["lm", "mnist1d"]),
    "policies": RegisteredNames(lambda: CURTAIL_POLICIES),
    "target_accuracy": click.FloatRange(0, 1, min_open=True),
}
#: defaults the presets alone do not tell: the workload's own split
EXPERIMENT_NOTES = {"partition": "the preset's; the lm workload's: iid"}


def policys_own(name: str) -> str:
    """Algorithm 1's parameters, unset, are the policy variant's own."""
    return "the policy's own"


_CURTAIL_HELP = {
    "workload": "What the sites train: the GPT-style LM or mnist1d's CNN.",
}


def flag_for(name: str, flags: Mapping[str, str] = EXPERIMENT_FLAGS) -> str:
    return flags.get(name, "--" + name.replace("_", "-"))


def param_type(annotation: object) -> click.ParamType | type:
    """The click type of a field's annotation (``X | None`` as ``X``)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return param_type(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return click.Choice([str(a) for a in typing.get_args(annotation)])
    if origin is tuple:
        return CommaList(typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return click.Choice([str(m.value) for m in annotation])
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return click.Path(path_type=Path)
    if annotation in (int, float, str, bool):
        return annotation
    raise TypeError(f"no command-line type for {annotation!r}")


def shown(value: object) -> str:
    """A default as the user would type it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ",".join(shown(v) for v in value)
    return str(value)


def states_default(field: FieldInfo) -> bool:
    """Whether the field's description already says what it defaults to."""
    return "default" in (field.description or "").lower()


def default_text(field: FieldInfo) -> str | None:
    """The field's own default as typed; None when it is computed (the description says it)."""
    if field.default_factory is not None:
        return None
    return shown(field.default)


def preset_defaults(
    model: type[BaseModel],
    presets: Mapping[str, Mapping[str, object]],
    notes: Mapping[str, str] | None = None,
    whose: str = "the preset's",
) -> DefaultNote:
    """The help's default of each field of ``model`` given a preset from ``presets``: "the
    preset's" where every preset sets the field; "the preset's, else X" where some do (X: the
    field's own, unless its description says it); the field's own default otherwise. ``notes``
    says it for fields these rules would misstate."""

    def note(name: str) -> str | None:
        if notes and name in notes:
            return notes[name]
        field = model.model_fields[name]
        setting = sum(name in values for values in presets.values())
        own = None if states_default(field) else default_text(field)
        if presets and setting == len(presets):
            return whose
        if setting:
            return f"{whose}, else {own}" if own else f"{whose}, if it sets one"
        return own

    return note


def model_options(
    model: type[BaseModel],
    names: Iterable[str],
    flags: Mapping[str, str] = EXPERIMENT_FLAGS,
    types_: Mapping[str, click.ParamType] = FIELD_TYPES,
    *,
    default: DefaultNote | None = None,
    dest: Callable[[str], str] = str,
    helps: Mapping[str, str] | None = None,
) -> Decorator:
    """A decorator adding one option per field ``names`` of ``model``, in that order: the
    command receives each under ``dest(field)`` (the field's name by default). ``default``
    says what the help gives as each one's default (the field's own when not given);
    ``helps`` replaces a field's description where a command narrows what it accepts."""
    options = []
    for name in names:
        field = model.model_fields[name]
        kind = types_.get(name) or param_type(field.annotation)
        text = (helps or {}).get(name) or field.description or ""
        text += "." if text and text[-1] not in ".?!" else ""
        if isinstance(kind, RegisteredNames):  # too many to read in a metavar
            text += " Known: " + ", ".join(kind.known()) + "."
        note = default(name) if default is not None else default_text(field)
        if note is not None and not (default is None and states_default(field)):
            text += f" [default: {note}]"
        decls = flag_for(name, flags)
        options.append(click.option(decls, dest(name), type=kind, default=None, help=text))

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def experiment_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Every ``ExperimentConfig`` field not in ``CLI_LESS``, then Algorithm 1's parameters
    (``GreedyParams``, flattened: ``--k0`` ...); the command receives them by field name."""
    names = [n for n in ExperimentConfig.model_fields if n not in CLI_LESS]
    command = model_options(GreedyParams, GreedyParams.model_fields, default=policys_own)(command)
    defaults = preset_defaults(ExperimentConfig, PRESETS, EXPERIMENT_NOTES)
    return model_options(ExperimentConfig, names, default=defaults)(command)


def curtail_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Every ``CurtailmentConfig`` field not in ``CURTAIL_CLI_LESS``, by field name, under the
    flags ``powertrip curtail`` always had (``CURTAIL_FLAGS``)."""
    names = [n for n in CurtailmentConfig.model_fields if n not in CURTAIL_CLI_LESS]
    return model_options(
        CurtailmentConfig,
        names,
        CURTAIL_FLAGS,
        _CURTAIL_TYPES,
        default=preset_defaults(CurtailmentConfig, CURTAIL_PRESETS),
        helps=_CURTAIL_HELP,
    )(command)
