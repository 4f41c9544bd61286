"""What every ``powertrip`` subcommand shares: the consoles, the one-line error, comma lists,
and turning a configuration's validation error into the flags the user typed."""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping
from typing import NoReturn

import click
from pydantic import ValidationError
from rich.console import Console

err = Console(stderr=True, soft_wrap=True)
out = Console(width=None if sys.stdout.isatty() else 160)


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit 2, no traceback."""
    err.print(f"[bold red]error:[/] {message}", highlight=False)
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
