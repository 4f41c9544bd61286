"""The architecture as a test: ``powertrip`` is a library that never loads gRPC or the services,
and the three services are applications that never import each other (they talk over gRPC).
The services live in ``services/`` and import as ``powertrip.services`` (one import root: the
symlink ``powertrip/services``), never as a top-level ``services``.

Each import check runs in a fresh interpreter, so what another test imported cannot hide a leak.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import powertrip
from tests.needs import extra_reason
from tests.size_report import long_modules

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("aggregator", "profiler", "worker")


#: Optional framework adapters (``pip install 'powertrip[flower]'``): their third-party
#: dependencies may use gRPC themselves (Flower does), so they are exempt from the no-gRPC rule,
#: but never from the no-services rule (``test_integrations_never_import_the_services``).
INTEGRATIONS = "powertrip.integrations."
SERVICES_PKG = "powertrip.services"


def _library_modules() -> list[str]:
    """Every module of the library except the generated stubs (``powertrip.v1``), which only
    the services import, and the optional integrations (``INTEGRATIONS``)."""
    names = ["powertrip"]
    for info in pkgutil.walk_packages(powertrip.__path__, "powertrip."):
        if not info.name.startswith(("powertrip.v1", INTEGRATIONS, SERVICES_PKG)):
            names.append(info.name)
    return names


def _loaded_after_import(*modules: str) -> list[str]:
    """Top-level packages loaded by a fresh interpreter after importing ``modules``, and
    ``powertrip.services`` if any of the services' modules was."""
    code = (
        f"import json, sys; import {', '.join(modules)}; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} | "
        f"{{'{SERVICES_PKG}' for m in sys.modules if m.startswith('{SERVICES_PKG}')}})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_library_has_the_documented_subpackages():
    modules = set(_library_modules())
    for sub in ("selection", "learning", "traces", "curtailment", "study"):
        assert f"powertrip.{sub}" in modules


def test_importing_the_whole_library_loads_neither_grpc_nor_the_services():
    """All modules in one interpreter: what is loaded only grows, so none of them alone can
    load grpc either."""
    loaded = _loaded_after_import(*_library_modules())
    assert "grpc" not in loaded, "some powertrip module pulls in grpc"
    assert SERVICES_PKG not in loaded, "some powertrip module pulls in the services package"
    assert "services" not in loaded


def test_the_public_api_is_importable_without_grpc():
    loaded = _loaded_after_import("powertrip")
    assert "grpc" not in loaded and "matplotlib" not in loaded
    assert "flwr" not in loaded, "import powertrip must not need the flower extra"
    for name in powertrip.__all__:
        assert getattr(powertrip, name) is not None, name


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_never_imports_another_service(service):
    others = [s for s in SERVICES if s != service]
    bad = []
    for path in sorted((REPO / "services" / service).rglob("*.py")):
        for line, name in _imports(path):
            parts = name.removeprefix("powertrip.").split(".")
            if parts[0] == "services" and len(parts) > 1 and parts[1] in others:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not bad, "\n".join(bad)


def test_the_shared_service_code_belongs_to_no_service():
    bad = []
    for path in sorted((REPO / "services" / "common").rglob("*.py")):
        for line, name in _imports(path):
            parts = name.removeprefix("powertrip.").split(".")
            if parts[0] == "services" and len(parts) > 1 and parts[1] in SERVICES:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not bad, "\n".join(bad)


def test_the_library_source_never_mentions_grpc_or_the_services():
    """The static twin of the import checks: it also covers code paths no import runs."""
    bad = []
    for path in sorted((REPO / "powertrip").rglob("*.py")):
        parts = path.relative_to(REPO / "powertrip").parts
        if "v1" in parts:
            continue
        # the integrations may reach gRPC through their frameworks, never the services
        banned = {"services"} if parts[0] == "integrations" else {"grpc", "services"}
        for line, name in _imports(path):
            top = name.removeprefix("powertrip.").split(".")[0]
            if top in banned or name.startswith("powertrip.v1"):
                bad.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not bad, "\n".join(bad)


def test_integrations_never_import_the_services():
    """Exempt from the no-gRPC rule only: importing every integration (where its framework is
    installed) loads neither the services nor the generated stubs."""
    pytest.importorskip("flwr", reason=extra_reason("flower", "flwr"))
    modules = [
        info.name
        for info in pkgutil.walk_packages(powertrip.__path__, "powertrip.")
        if info.name.startswith(INTEGRATIONS)
    ]
    assert "powertrip.integrations.flower.strategy" in modules
    code = (
        f"import json, sys; import {', '.join(modules)}; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m == 'services' or m.startswith(('services.', 'powertrip.v1', "
        f"'{SERVICES_PKG}')))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_size_report_lists_the_long_modules_longest_first(tmp_path):
    """Module length is reported, not enforced (tests/size_report.py): a module splits where
    its idea splits, not at a count."""
    (tmp_path / "powertrip").mkdir()
    (tmp_path / "services").mkdir()
    (tmp_path / "powertrip" / "short.py").write_text("x = 1\n" * 10)
    (tmp_path / "powertrip" / "long.py").write_text("x = 1\n" * 301)
    (tmp_path / "services" / "longer.py").write_text("x = 1\n" * 400)
    (tmp_path / "services" / "api_pb2.py").write_text("x = 1\n" * 900)
    assert long_modules(tmp_path) == [("services/longer.py", 400), ("powertrip/long.py", 301)]


def test_nothing_imports_the_services_as_a_top_level_package():
    """One import root: a top-level ``services`` import works in a checkout only, and an
    installed powertrip would be shadowed by (or shadow) any other ``services`` package."""
    bad = []
    for root in ("services", "tests", "benchmarks", "examples", "powertrip"):
        for path in sorted((REPO / root).rglob("*.py")):
            for line, name in _imports(path):
                if name == "services" or name.startswith("services."):
                    bad.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not bad, "\n".join(bad)


def test_the_services_package_is_the_top_level_folder_through_one_symlink():
    link = REPO / "powertrip" / "services"
    assert link.is_symlink() and link.resolve() == (REPO / "services").resolve()
