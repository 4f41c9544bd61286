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


def claimed_rows() -> dict[str, list[str]]:
    """row -> "file::test" for every ``@pytest.mark.reliability(...)`` in tests/."""
    rows: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            for dec in node.decorator_list:
                if (
                    isinstance(dec, ast.Call)
                    and isinstance(dec.func, ast.Attribute)
                    and dec.func.attr == "reliability"
                ):
                    for arg in dec.args:
                        assert isinstance(arg, ast.Constant), f"{path}:{node.lineno}: literal rows"
                        rows.setdefault(arg.value, []).append(f"{path.name}::{node.name}")
    return rows


def test_every_row_from_r1_to_r25_has_a_test():
    claimed = claimed_rows()
    assert [r for r in ROWS if r not in claimed] == []


def test_no_test_claims_a_row_the_matrix_does_not_have():
    assert [r for r in claimed_rows() if r not in ROWS] == []


def test_the_reliability_doc_describes_every_row():
    text = DOC.read_text()
    assert [r for r in ROWS if f"| {r} |" not in text] == []
