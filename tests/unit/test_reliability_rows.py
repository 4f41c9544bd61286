"""Every row of the reliability matrix (docs/reliability.md) is claimed by at least one test.

Read from the test sources (not from a collection), so a row whose only test was deleted or
renamed away fails here, in any run, even one that selects a few files.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.reliability_report import ROWS

TESTS = Path(__file__).resolve().parents[1]
DOC = TESTS.parent / "docs" / "reliability.md"


def _marks(node: ast.AST) -> list[ast.Call]:
    """The ``pytest.mark.reliability(...)`` calls a test, class or module (``pytestmark``)
    carries."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        candidates = list(node.decorator_list)
    elif isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
    ):
        value = node.value
        candidates = list(value.elts) if isinstance(value, ast.List | ast.Tuple) else [value]
    else:
        return []
    return [
        c
        for c in candidates
        if isinstance(c, ast.Call)
        and isinstance(c.func, ast.Attribute)
        and c.func.attr == "reliability"
    ]


def claimed_rows() -> dict[str, list[str]]:
    """row -> "file::test" for every ``@pytest.mark.reliability(...)`` (or module-level
    ``pytestmark``) in tests/."""
    rows: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = getattr(node, "name", "pytestmark")
            for mark in _marks(node):
                for arg in mark.args:
                    assert isinstance(arg, ast.Constant), f"{path}:{node.lineno}: literal rows"
                    rows.setdefault(arg.value, []).append(f"{path.name}::{name}")
    return rows


def test_every_row_has_a_test():
    claimed = claimed_rows()
    assert [r for r in ROWS if r not in claimed] == []


def test_no_test_claims_a_row_the_matrix_does_not_have():
    assert [r for r in claimed_rows() if r not in ROWS] == []


def test_the_reliability_doc_describes_every_row():
    text = DOC.read_text()
    assert [r for r in ROWS if f"| {r} |" not in text] == []


def test_the_matrix_is_reported_when_xdist_runs_the_tests(tmp_path):
    """Under ``-n`` the controller collects nothing: each report brings its test's rows."""
    import subprocess
    import sys

    import pytest

    pytest.importorskip("xdist", reason="needs pytest-xdist: pip install pytest-xdist")

    (tmp_path / "test_row.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.reliability('R1')\ndef test_a():\n    pass\n\n"
        "@pytest.mark.reliability('R2')\ndef test_b():\n    pass\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.reliability_report",
            "-o",
            "addopts=",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=TESTS.parent,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert "R1 PASS" in done.stdout and "R2 PASS" in done.stdout
