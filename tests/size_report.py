"""A pytest plugin: the library and service modules longer than 300 lines, as a report.

Size is a smell, not a rule: a module holds one idea and splits where the idea splits, never to
meet a count (a failing line-count test drew folded argument lists and ideas cut in two). The
list is printed at the end of every full run, so a module that grew past the mark is seen and
read, and split if it holds more than one idea.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the mark past which a module is listed
LINES = 300


def long_modules(repo: Path = REPO, lines: int = LINES) -> list[tuple[str, int]]:
    """(path, lines) of every hand-written module of the library and the services past ``lines``,
    longest first (generated protobuf stubs excluded)."""
    found = []
    for root in ("powertrip", "services"):
        for path in sorted((repo / root).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            n = len(path.read_text().splitlines())
            if n > lines:
                found.append((str(path.relative_to(repo)), n))
    return sorted(found, key=lambda item: -item[1])


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's type
    if terminalreporter.config.option.collectonly:
        return
    found = long_modules()
    if not found:
        return
    terminalreporter.section(f"modules past {LINES} lines (a smell: one idea each?)")
    for path, n in found:
        terminalreporter.write_line(f"{n:5d}  {path}")
