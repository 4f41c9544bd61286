"""What every ``powertrip`` subcommand shares: the consoles, the one-line error, comma lists,
and turning a configuration's validation error into the flags the user typed."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

import click
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from powertrip.config.experiment import ExperimentConfig
from powertrip.config.workloads import BUILTIN_WORKLOADS, validate_workload

err = Console(stderr=True, soft_wrap=True)
out = Console(width=None if sys.stdout.isatty() else 160)

T = TypeVar("T")


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit 2, no traceback."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    sys.exit(2)


def output_problem(path: Path) -> str | None:
    """Why ``path`` cannot be an output folder (it is a file, cannot be created, is not
    writable), or None. Creates what is missing and writes a file to find out, then removes
    both: a command refused later leaves nothing behind."""
    if os.path.lexists(path) and not os.path.isdir(path):  # os.path: False on any OSError
        return "exists and is not a folder"
    missing = []
    for p in (path, *path.parents):
        if os.path.lexists(p):
            break
        missing.append(p)
    made: list[Path] = []
    try:
        for p in reversed(missing):
            try:
                p.mkdir()
            except OSError as exc:
                where = "" if p == path else f" ({p})"
                return f"cannot create the folder{where}: {exc.strerror or exc}"
            made.append(p)
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".powertrip-write-test-"):
                pass
        except OSError as exc:
            return f"cannot write in it: {exc.strerror or exc}"
    finally:
        for p in reversed(made):
            with contextlib.suppress(OSError):
                p.rmdir()
    return None


def require_output(path: Path, flag: str = "--output") -> Path:
    """``output_problem`` as the command's one-line error (for a default chosen after parsing)."""
    problem = output_problem(path)
    if problem is not None:
        fail(f"{flag} {path}: {problem}")
    return path


class OutputDir(click.ParamType):
    """A folder the command writes (--output, --tensorboard, --logdir): refused at parsing, with
    one line naming the flag and the path, when it cannot be one (``output_problem``)."""

    name = "directory"

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        path = value if isinstance(value, Path) else Path(value)
        flags = param.opts if param is not None else ["--output"]
        return require_output(path, next((f for f in flags if f.startswith("--")), flags[0]))


def check_sweep(cfg: ExperimentConfig) -> None:
    """Static-k values above ``--sites`` cannot run: a warning naming the dropped ones, or the
    command's error when none is left and the study needs the sweep (static-optimal, random or
    the automatic target)."""
    needs = sorted({"static-optimal", "random"} & set(cfg.policies))
    needs += ["the automatic target"] if cfg.target_accuracy is None else []
    dropped = [k for k in cfg.static_sweep if k > cfg.num_sites]
    if not needs or not dropped:
        return
    if not cfg.effective_sweep:
        fail(
            f"--sweep {','.join(map(str, cfg.static_sweep))}: every k exceeds --sites "
            f"{cfg.num_sites}; {' and '.join(needs)} need a static-k run with k <= "
            f"{cfg.num_sites}"
        )
    err.print(
        f"[bold yellow]warning:[/] --sweep: dropping {','.join(map(str, dropped))} "
        f"(more than --sites {cfg.num_sites})",
        highlight=False,
    )


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


class RegisteredNames(CommaList):
    """A comma list of names a registry knows (``known()`` lists them in the help; ``check``
    raises ValueError for an unknown one), so a typo is refused before anything starts. Without
    ``check`` the configuration's model refuses it, with the command's other bad values."""

    def __init__(
        self, known: Callable[[], Sequence[str]], check: Callable[[str], object] | None = None
    ) -> None:
        super().__init__(str)
        self.known, self.check = known, check

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "NAME[,NAME...]"

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        names = super().convert(value, param, ctx)
        if self.check is None:
            return names
        for name in names:
            try:
                self.check(name)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        return names


class RegisteredName(click.ParamType):
    """One name a registry knows (``powertrip.codecs``: ``int8``, ``topk-<p>``...)."""

    name = "name"

    def __init__(self, known: Callable[[], Sequence[str]], check: Callable[[str], object]) -> None:
        self.known, self.check = known, check

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(self.known()) + "]"

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        try:
            self.check(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return str(value)


def configured(
    build: Callable[[], T], what: str, flags: Mapping[str, str], flattened: Collection[str] = ()
) -> T:
    """``build()``'s configuration, or the command ended with one line: a ``ValidationError`` as
    ``describe_validation`` words it, any other ``ValueError`` as it is."""
    try:
        return build()
    except ValidationError as exc:
        fail(describe_validation(exc, what, flags, flattened))
    except ValueError as exc:
        fail(str(exc))


def preset_option(  # noqa: ANN201
    presets: Mapping[str, Mapping[str, object]], default: str, flag: str = "--preset"
):
    """``--preset`` (or ``flag``): a choice of ``presets``, each explained by its description in
    the help; the study commands and ``up`` share it so all describe their presets the same
    way."""
    described = "; ".join(f"{k}: {v['description']}" for k, v in presets.items())
    return click.option(
        flag,
        type=click.Choice(list(presets)),
        default=default,
        show_default=True,
        help=f"Starting configuration. {described}.",
    )


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
