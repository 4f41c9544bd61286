"""The library's folders form layers: each imports only the ones below it, and no two modules
import each other, directly or around a circle. ``docs/architecture.md`` draws the same order.

An import inside a function or under ``TYPE_CHECKING`` counts too: a lazy import is still a
dependency, it only moves the cost.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

LIBRARY = Path(__file__).resolve().parents[2] / "powertrip"

#: Bottom to top. ``config`` is the settings (torch-free); ``federation`` composes a run from
#: everything below it; ``study`` and the Flower integration are the library's front-ends.
LAYERS = (
    "config",
    "fetch",
    "extras",
    "lazy",
    "state_dict",
    "traces",
    "sites",
    "learning",
    "codecs",
    "aggregation",
    "selection",
    "rounds",
    "footprint",
    "curtailment",
    "federation",
    "integrations",
    "study",
)
NOT_LIBRARY = ("services", "v1")  # the services (above it all) and the generated stubs


def _module_name(path: Path) -> str:
    parts = path.relative_to(LIBRARY.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _library_files() -> list[Path]:
    return [
        p
        for p in sorted(LIBRARY.rglob("*.py"))
        if p.relative_to(LIBRARY).parts[0] not in NOT_LIBRARY
    ]


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """The library modules ``path`` imports: ``from a.b import c`` is ``a.b.c`` when that is a
    module, else ``a.b``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            found |= subs
            if len(subs) < len(node.names) and node.module in known:
                found.add(node.module)
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in _library_files()}
    known = set(files)
    return {name: _imported_modules(path, known) - {name} for name, path in files.items()}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the package root, powertrip itself


def test_every_folder_and_top_level_module_has_a_layer():
    tops = {p.relative_to(LIBRARY).parts[0].removesuffix(".py") for p in _library_files()}
    assert tops - {"__init__"} == set(LAYERS)


def test_each_layer_imports_only_the_layers_below_it():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for module, imported in _graph().items():
        src = _layer(module)
        if src is None:  # powertrip/__init__.py re-exports the public API from every layer
            continue
        for target in imported:
            dst = _layer(target)
            if dst is None:
                upward.append(f"{module} imports the package root")
            elif rank[dst] > rank[src]:
                upward.append(f"{module} ({src}) imports {target} ({dst})")
    assert not upward, "imports that point up:\n" + "\n".join(sorted(upward))


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_modules_import_each_other_around_a_circle():
    assert _circles(_graph()) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_circle_finder_finds_circles(graph, expected):
    assert _circles(graph) == expected


def _heavy_modules_after_import(module: str) -> list[str]:
    code = (
        f"import sys; import {module}; "
        "print(sorted(m for m in ('torch', 'matplotlib', 'grpc') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=LIBRARY.parent, capture_output=True, text=True, check=True
    )
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "module",
    [
        "powertrip.config.experiment",
        "powertrip.config.curtailment",
        "powertrip.config.site_engine",
        "powertrip.config.recipe",
        "powertrip.config.workloads",
    ],
)
def test_the_settings_load_no_torch_and_no_grpc(module):
    assert _heavy_modules_after_import(module) == []


def test_the_profiler_loads_no_torch():
    """It reads traces and measures links: nothing of it trains a model."""
    assert "torch" not in _heavy_modules_after_import("powertrip.services.profiler.servicer")
