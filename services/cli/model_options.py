"""Command-line options derived from a configuration model: one ``--flag`` per field, with the
field's name as the parameter, its type (choices from a ``Literal`` or an enum, comma lists for
tuples), and its ``description`` as the help. Every option defaults to unset, so a flag not given
leaves the preset's value.

``experiment_options`` is ``powertrip experiment``'s set: every ``ExperimentConfig`` field but
those in ``CLI_LESS``, under the flag names users already type (``EXPERIMENT_FLAGS``).
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

from powertrip.codecs import codec_names, get_codec
from powertrip.config.curtailment import CurtailmentConfig
from powertrip.config.experiment import ExperimentConfig, GreedyParams
from powertrip.selection.registry import known_policy_names, validate_policy_name
from powertrip.services.cli.common import CommaList, RegisteredName, RegisteredNames, WorkloadName

__all__ = [
    "CLI_LESS",
    "EXPERIMENT_FLAGS",
    "TargetAccuracy",
    "experiment_options",
    "flag_for",
    "lm_options",
    "model_options",
]

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


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
    "batch_size": "the workload's; no flag yet",
    "local_epochs": "one local epoch (or --local-steps); no flag yet",
    "round_trip": "Eq. 3 is one way; no flag yet",
    "tokenizer_sha256": "filled in by the aggregator for its workers",
    "greedy": "its fields are flags of their own (--k0, --window, ...)",
    "local_optimizer": "its fields are the optimizer flags (optimizer_options)",
}

#: Parameter types a field's annotation does not say: a checked workload name, 'auto' as a
#: target, and the LM's sizes refused by click as before.
_TYPES: dict[str, click.ParamType] = {
    "workload": WorkloadName(),
    "policies": RegisteredNames(known_policy_names, validate_policy_name),
    "codec": RegisteredName(codec_names, get_codec),
    "target_accuracy": TargetAccuracy(),
    **{n: click.IntRange(min=1) for n in ("n_layer", "n_head", "d_model", "context_length")},
}


def flag_for(name: str, flags: Mapping[str, str] = EXPERIMENT_FLAGS) -> str:
    return flags.get(name, "--" + name.replace("_", "-"))


def param_type(annotation: object) -> click.ParamType | type:
    """The click type of a field's annotation (``X | None`` as ``X``)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
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


def model_options(
    model: type[BaseModel],
    names: Iterable[str],
    flags: Mapping[str, str] = EXPERIMENT_FLAGS,
    types_: Mapping[str, click.ParamType] = _TYPES,
) -> Decorator:
    """A decorator adding one option per field ``names`` of ``model``, in that order."""
    options = []
    for name in names:
        field = model.model_fields[name]
        kind = types_.get(name) or param_type(field.annotation)
        help_text = field.description or ""
        if isinstance(kind, RegisteredNames):  # too many to read in a metavar
            help_text += " Known: " + ", ".join(kind.known()) + "."
        options.append(click.option(flag_for(name, flags), name, type=kind, help=help_text))

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def experiment_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Every ``ExperimentConfig`` field not in ``CLI_LESS``, then Algorithm 1's parameters
    (``GreedyParams``, flattened: ``--k0`` ...); the command receives them by field name."""
    names = [n for n in ExperimentConfig.model_fields if n not in CLI_LESS]
    command = model_options(GreedyParams, GreedyParams.model_fields)(command)
    return model_options(ExperimentConfig, names)(command)


#: The language model's size and tokenizer, shared by the study commands (``--workload lm``).
LM_FIELDS = ("model_size", "n_layer", "n_head", "d_model", "context_length", "tokenizer")
lm_options = model_options(CurtailmentConfig, LM_FIELDS)
