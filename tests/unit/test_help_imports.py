"""``--help`` is a page, not a start-up: every command's help (``powertrip``, each subcommand and
the three services) prints in a fresh process that loads none of torch, matplotlib, gRPC or the
training code, and still lists every option (or, for a service, every variable).

Each case runs the installed entry point's function in its own interpreter and reads back
``sys.modules`` after the help was printed: what the help loaded, not how long it took.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from powertrip.services.cli.main import COMMANDS, LazyGroup, main

REPO = Path(__file__).resolve().parents[2]

#: loaded by no --help: the model and its training, plots, the wire, the tokenizers
NEVER = (
    "torch",
    "matplotlib",
    "grpc",
    "tokenizers",
    "prometheus_client",
    "powertrip.learning",
    "powertrip.study",
    "powertrip.federation",
    "powertrip.integrations",
)
#: loaded only by the help that needs it: numpy for the commands whose help lists the policy and
#: codec registries (their names are known by importing them); cryptography for ``certs`` (the
#: module is the cluster's PKI)
NEEDS = {
    "numpy": {"experiment", "curtail", "up"},
    "cryptography": {"certs"},
}

#: the services: console script -> (module, config class) whose variables the help lists
SERVICES = {
    "powertrip-aggregator": ("powertrip.services.aggregator.config", "AggregatorConfig"),
    "powertrip-profiler": ("powertrip.services.profiler.config", "ProfilerConfig"),
    "powertrip-worker": ("powertrip.services.worker.config", "WorkerConfig"),
}

#: run in a fresh interpreter: the entry point's function with ARGV, then what is loaded
PROBE = """
import json, sys
from importlib import import_module
name, module, attr, *argv = sys.argv[1:]
sys.argv = [name, *argv]
code = 0
try:
    getattr(import_module(module), attr)()
except SystemExit as exc:
    code = exc.code or 0
sys.stdout.flush()
print("\\nLOADED " + json.dumps({"exit": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def script(name: str) -> str:
    """The installed console script's "module:attr" (pyproject.toml's [project.scripts])."""
    (found,) = entry_points(group="console_scripts", name=name)
    return found.value


def help_of(name: str, *args: str) -> tuple[str, set[str]]:
    """The help text of console script ``name`` with ``args --help``, and the modules loaded."""
    module, _, attr = script(name).partition(":")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, name, module, attr, *args, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("LOADED ")]
    report = json.loads(line.removeprefix("LOADED "))
    assert report["exit"] == 0, f"{name} {' '.join(args)} --help exited {report['exit']}"
    return proc.stdout, set(report["modules"])


def heavy_loaded(modules: set[str], command: str) -> list[str]:
    """The modules of NEVER (and of NEEDS, unless ``command`` needs them) that were loaded."""
    banned = [*NEVER, *(m for m, users in NEEDS.items() if command not in users)]
    return sorted(m for m in modules if any(m == b or m.startswith(b + ".") for b in banned))


def present(name: str) -> bool:
    return name in main.commands


def command_paths() -> Iterator[tuple[str, ...]]:
    """Every ``powertrip`` subcommand, and the subcommands of those that are groups."""
    for name in COMMANDS:
        yield (name,)
        command = main.commands.get(name)
        if isinstance(command, click.Group):
            yield from ((name, sub) for sub in command.list_commands(click.Context(command)))


def click_command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        found = command.get_command(click.Context(command), name)
        assert found is not None, f"powertrip {' '.join(path)}: no such command"
        command = found
    return command


def test_powertrip_help_lists_every_command_and_loads_only_click():
    text, modules = help_of("powertrip")
    assert heavy_loaded(modules, "powertrip") == []
    assert not {"pydantic", "rich"} & modules, "the listing needs no command module"
    for name in COMMANDS:
        assert (f"  {name} " in text) == present(name), f"{name} listed: {not present(name)}"
    assert "--version" in text


@pytest.mark.parametrize("path", list(command_paths()), ids=" ".join)
def test_a_command_help_lists_its_options_without_the_heavy_imports(path):
    if not present(path[0]):
        pytest.skip(f"{COMMANDS[path[0]]} is not in this checkout")
    text, modules = help_of("powertrip", *path)
    assert heavy_loaded(modules, path[0]) == [], f"powertrip {' '.join(path)} --help"
    assert f"Usage: powertrip {' '.join(path)}" in text
    command = click_command(path)
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            flag = max(param.opts, key=len)
            assert flag in text, f"powertrip {' '.join(path)} --help does not list {flag}"
    if isinstance(command, click.Group):
        for sub in command.list_commands(click.Context(command)):
            assert f"  {sub} " in text, f"powertrip {path[0]} --help does not list {sub}"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_service_help_lists_its_variables_without_the_service(name):
    from powertrip.services.common.config import env_name

    text, modules = help_of(name)
    assert heavy_loaded(modules, name) == [], f"{name} --help"
    assert not {"numpy", "cryptography", "google.protobuf"} & modules
    module, cls = SERVICES[name]
    config = getattr(importlib.import_module(module), cls)
    assert text.startswith(f"usage: {name}")
    for field in config.model_fields:
        assert env_name(field) in text, f"{name} --help does not list {env_name(field)}"


def test_the_listing_says_what_each_command_says_of_itself():
    """Short help read from the sources (no import) is click's own: the same page as a group
    with every command loaded."""
    fresh = LazyGroup("powertrip", lazy=COMMANDS, help=main.help, params=main.params)
    lazy = CliRunner().invoke(fresh, ["--help"], terminal_width=100)
    assert not fresh.commands.loaded, "the listing imported a command"
    eager = click.Group("powertrip", help=main.help, params=main.params)
    for name in fresh.list_commands(click.Context(fresh)):
        eager.add_command(fresh.commands[name], name)
    loaded = CliRunner().invoke(eager, ["--help"], terminal_width=100)
    assert lazy.exit_code == loaded.exit_code == 0
    assert lazy.output.partition("Commands:")[2] == loaded.output.partition("Commands:")[2]
    assert lazy.output.partition("Commands:")[2].strip()


def test_a_command_whose_module_is_absent_is_not_listed_and_not_found():
    @click.group(cls=LazyGroup, lazy={"ghost": "powertrip.services.cli.no_such:ghost", **COMMANDS})
    def group() -> None:
        """A group with a command still to come."""

    page = CliRunner().invoke(group, ["--help"])
    assert page.exit_code == 0 and "ghost" not in page.output and "experiment" in page.output
    assert "ghost" not in group.commands and "ghost" not in list(group.commands)
    called = CliRunner().invoke(group, ["ghost"])
    assert called.exit_code == 2 and "No such command 'ghost'" in called.output


def test_a_help_the_source_does_not_spell_out_is_read_from_the_command(tmp_path, monkeypatch):
    """A computed help, a hidden or a deprecated command: the listing imports it and shows what
    click would; a plain docstring is read without importing its module."""
    (tmp_path / "lazy_listing_commands.py").write_text(
        "import click\n"
        "WHAT = 'Computed. More words.'\n"
        "@click.command(help=WHAT)\ndef computed():\n    pass\n"
        "@click.command(hidden=True)\ndef secret():\n    'Hidden.'\n"
        "@click.command(deprecated=True)\ndef old():\n    'Old.'\n"
        "@click.command()\ndef plain():\n    'Plain. Read from the source.'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    table = {n: f"lazy_listing_commands:{n}" for n in ("computed", "secret", "old", "plain")}
    group = LazyGroup("g", lazy=table)
    page = CliRunner().invoke(group, ["--help"])
    assert page.exit_code == 0, page.output
    listed = dict(
        line.split(None, 1)
        for line in page.output.partition("Commands:")[2].splitlines()
        if line.strip()
    )
    assert listed["computed"] == "Computed."
    assert "secret" not in listed
    assert listed["old"].startswith("Old.") and "deprecated" in listed["old"].lower()
    assert listed["plain"] == "Plain."
    assert set(group.commands.loaded) == {"computed", "secret", "old"}
