"""The ``powertrip`` command line.

Each subcommand is named here by where it lives ("module:attribute") and imported only when it
runs or shows its own help, so ``powertrip --help`` (and a command's ``--help``) costs a
page, not torch, gRPC and the training code: the listing reads each command's short help
from its module's source. Command modules keep their heavy imports inside the function that
does the work.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import click

#: subcommand -> "module:attribute" of its click command; a module not (yet) installed is left
#: out of the listing. Finding a module imports its packages: keep commands in light ones (here).
COMMANDS: dict[str, str] = {
    "certs": "powertrip.services.cli.certs:certs",
    "curtail": "powertrip.services.cli.curtail:curtail",
    "data": "powertrip.services.cli.data:data",
    "experiment": "powertrip.services.cli.experiment:experiment",
    "export-tensorboard": "powertrip.services.cli.export:export_tensorboard_command",
    "flower": "powertrip.services.cli.flower:flower",
    "model": "powertrip.services.cli.model:model",
    "traces": "powertrip.services.cli.traces:traces",
    "up": "powertrip.services.cli.up:up",
}


def _present(reference: str) -> bool:
    """Whether the command's module exists, without importing it."""
    module = reference.partition(":")[0]
    return importlib.util.find_spec(module) is not None


def load_command(name: str, reference: str) -> click.Command:
    """The click command ``reference`` ("module:attribute") names."""
    module, _, attr = reference.partition(":")
    command = getattr(importlib.import_module(module), attr)
    if not isinstance(command, click.Command):
        raise TypeError(
            f"powertrip {name}: {reference} is a {type(command).__name__}, not a command"
        )
    return command


def source_help(reference: str) -> dict[str, str] | None:
    """The ``help``/``short_help`` the command ``reference`` names is given (its decorator's
    argument, else its function's docstring as ``help``), read from its module's source without
    importing it; None when the source does not say it plainly (the command is then imported)."""
    module, _, attr = reference.partition(":")
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    try:
        with open(spec.origin, encoding="utf-8") as f:
            tree = ast.parse(f.read(), spec.origin)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name == attr):
            continue
        for decorator in node.decorator_list:  # the @...command(...)/@...group(...) one
            if not isinstance(decorator, ast.Call) or _called(decorator) not in _MAKERS:
                continue
            given: dict[str, str] = {}
            for kw in decorator.keywords:
                if kw.arg in _SAID_ELSEWHERE:  # hidden, deprecated: the command knows
                    return None
                if kw.arg in _HELP:
                    text = kw.value.value if isinstance(kw.value, ast.Constant) else None
                    if not isinstance(text, str):  # computed: the command is imported for it
                        return None
                    given[kw.arg] = text
            if given:
                return given
        doc = ast.get_docstring(node, clean=False)
        return None if doc is None else {"help": doc}
    return None


_HELP = {"help", "short_help"}
_SAID_ELSEWHERE = {"hidden", "deprecated"}
_MAKERS = {"command", "group"}


def _called(call: ast.Call) -> str | None:
    """``command`` for ``@click.command(...)`` or ``@main.command(...)``."""
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's commands, each imported from its "module:attribute" on first lookup; listing
    and membership import nothing (a module not installed is not a member)."""

    def __init__(self, table: Mapping[str, str]) -> None:
        self.table = dict(table)
        self.loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self.loaded:
            if name not in self:
                raise KeyError(name)
            self.loaded[name] = load_command(name, self.table[name])
        return self.loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self.loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self.loaded.pop(name, None)
        self.table.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self.loaded or (name in self.table and _present(self.table[name]))

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(n for n in {*self.loaded, *self.table} if n in self))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class LazyGroup(click.Group):
    """A group whose subcommands load on first use (the click docs' LazyGroup, its table in
    ``commands``), and whose subcommands' usage errors (a bad value, an unknown option) end
    like every other bad input: one line naming the flag, exit 2, instead of click's usage
    block."""

    def __init__(self, *args: Any, lazy: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: LazyCommands = LazyCommands(lazy)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, each short help read from source where it can be (no import)."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max((len(n) for n in names), default=0)
        rows = []
        for name in names:
            loaded = name in self.commands.loaded
            given = None if loaded else source_help(self.commands.table[name])
            # click's own shortening, applied to what the source gives or to the command
            command = (
                self.get_command(ctx, name)
                if given is None
                else click.Command(name, help=given.get("help"), short_help=given.get("short_help"))
            )
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):  # noqa: ANN201 - click's signature
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # help, not an error (click >= 8.2)
                raise
            from powertrip.services.cli.common import fail  # rich: only on the way out

            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            fail(exc.format_message() + where)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="powertrip")
def main() -> None:
    """PowerTrip: power- and network-aware federated training across datacenters."""


if __name__ == "__main__":
    main()
