"""What every ``powertrip`` subcommand shares: the consoles, the one-line error, comma lists,
and turning a configuration's validation error into the flags the user typed."""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping
from typing import NoReturn, get_args

import click
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from powertrip.experiment import ModelSize
from powertrip.workloads import BUILTIN_WORKLOADS, validate_workload

err = Console(stderr=True, soft_wrap=True)
out = Console(width=None if sys.stdout.isatty() else 160)


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit 2, no traceback."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    sys.exit(2)


def describe_validation(
    exc: ValidationError,
    what: str,
    flags: Mapping[str, str],
    flattened: Collection[str] = (),
) -> str:
    """``invalid <what>: --flag: message; ...``; ``flattened`` names nested models whose fields
    are top-level flags (e.g. the greedy parameters)."""
    parts = []
    for e in exc.errors():
        field = ".".join(str(x) for x in e["loc"] if x not in flattened)
        flag = flags.get(field, "--" + field.replace("_", "-")) if field else ""
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{flag}: {msg}" if flag else msg)
    return f"invalid {what}: " + "; ".join(parts)


class WorkloadName(click.ParamType):
    """A built-in workload, or ``package.module:attribute`` naming a ``powertrip.CustomWorkload``
    (imported here, so a typo is refused before anything starts)."""

    name = "workload"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(BUILTIN_WORKLOADS) + "|MODULE:ATTR]"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None):
        try:
            return validate_workload(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class CommaList(click.ParamType):
    """``10,20,50`` -> (10, 20, 50), each item converted by ``kind``."""

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.name = f"{kind.__name__}[,{kind.__name__}...]"

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        if isinstance(value, tuple):
            return value
        try:
            return tuple(self.kind(v.strip()) for v in value.split(",") if v.strip())
        except ValueError:
            kind = self.kind.__name__
            self.fail(f"{value!r} is not a comma-separated list of {kind}", param, ctx)


def preset_option(presets: Mapping[str, Mapping[str, object]], default: str):  # noqa: ANN201
    """``--preset``: a choice of ``presets``, each explained by its description in the help; the
    study commands share it so both describe their presets the same way."""
    described = "; ".join(f"{k}: {v['description']}" for k, v in presets.items())
    return click.option(
        "--preset",
        type=click.Choice(list(presets)),
        default=default,
        show_default=True,
        help=f"Starting configuration. {described}.",
    )


def lm_options(command):  # noqa: ANN001, ANN201 - a click decorator
    """The language model's size flags, shared by the study commands (``--workload lm``)."""
    sizes = get_args(ModelSize)
    options = [
        click.option(
            "--model-size",
            type=click.Choice(sizes),
            help="LM size (default tiny, ~1 M parameters; xl ~570 M needs a GPU).",
        ),
        click.option("--n-layer", type=click.IntRange(min=1), help="LM: transformer blocks."),
        click.option("--n-head", type=click.IntRange(min=1), help="LM: attention heads."),
        click.option("--d-model", type=click.IntRange(min=1), help="LM: embedding width."),
        click.option("--context-length", type=click.IntRange(min=1), help="LM: tokens per window."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _check_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from powertrip.learning.device import resolve_device  # torch: only once parsing is done

    try:
        resolve_device(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    return value


def device_option(command):  # noqa: ANN001, ANN201 - a click decorator
    """``--device``: where the sites train; checked here, once, so a missing GPU ends the
    command before any data is loaded. Not part of the run's configuration (its identity)."""
    return click.option(
        "--device",
        default="auto",
        show_default=True,
        callback=_check_device,
        help="auto|cpu|cuda[:N]: where models train (auto: CUDA when present).",
    )(command)
