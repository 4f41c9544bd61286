"""Pytest plugin: the reliability matrix's rows, each with the tests that assert it, pass or fail.

A test claims rows with ``@pytest.mark.reliability("R2", "R18")``. After a run that collected
such tests, the terminal summary prints one line per row of ``docs/reliability.md``: PASS (every
test of the row passed; PASS* when some were skipped), FAIL (naming the failing tests), SKIP
(skipped: e.g. no root here), NOT RUN (a run stopped early) or MISSING (no test collected).
``--reliability-json PATH`` writes the same as JSON, for a closing note or a dashboard.
Loaded by ``-p tests.reliability_report`` (pyproject addopts).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

#: row -> what it promises, in a few words (the full rows: docs/reliability.md)
ROWS: dict[str, str] = {
    "R1": "worker killed mid-upload",
    "R2": "worker frozen (SIGSTOP)",
    "R3": "link blackhole",
    "R4": "slow site link",
    "R5": "added latency",
    "R6": "aggregator SIGKILL, restart bit-identical",
    "R7": "corrupt or half-written checkpoint",
    "R8": "oversized message",
    "R9": "large model streamed; chunk faults",
    "R10": "malformed protobuf",
    "R11": "well-formed but invalid update",
    "R12": "NaN/Inf in an update",
    "R13": "Byzantine updates",
    "R14": "unauthenticated peer",
    "R15": "identity spoofing",
    "R16": "allow-list and revocation",
    "R17": "replayed update",
    "R18": "worker re-registers mid-run",
    "R19": "quorum lost",
    "R20": "profiler input faults",
    "R21": "profiler down or slow",
    "R22": "keepalive and long idle",
    "R23": "SIGTERM",
    "R24": "registration and request flood",
    "R25": "deploy-config drift",
    "R26": "weight inflation",
    "R27": "server impersonation",
    "R28": "site squatting and role confusion",
    "R29": "certificate lifecycle",
    "R30": "journal and status growth",
    "R31": "sharded update faults",
    "R32": "a distributed site's rank dies",
    "R33": "absurd update values (robust aggregation by default)",
    "R34": "journal damage never costs a checkpoint",
    "R35": "worker state file damage",
    "R36": "reported metrics out of range",
    "R37": "curtailment over the services: crash, missing site",
    "R38": "shutdown within grace; /metrics exposure",
}


def rows_of(item: pytest.Item) -> list[str]:
    return [str(r) for m in item.iter_markers("reliability") for r in m.args]


class ReliabilityReport:
    def __init__(self, json_path: str | None) -> None:
        self.json_path = json_path
        self.tests: dict[str, list[str]] = defaultdict(list)  # row -> node ids
        self.outcome: dict[str, str] = {}  # node id -> passed / failed / skipped

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            for row in rows_of(item):
                if row not in ROWS:
                    raise pytest.UsageError(f"{item.nodeid}: unknown reliability row {row!r}")
                self.tests[row].append(item.nodeid)
            if rows := rows_of(item):  # the report carries them to xdist's controller
                item.user_properties.append(("reliability", rows))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, rows in report.user_properties:  # under xdist the controller collects nothing
            if key == "reliability":
                for row in rows:
                    if report.nodeid not in self.tests[row]:
                        self.tests[row].append(report.nodeid)
        if report.failed:
            self.outcome[report.nodeid] = "failed"
        elif report.skipped and report.nodeid not in self.outcome:
            self.outcome[report.nodeid] = "skipped"
        elif report.when == "call" and report.passed:
            self.outcome.setdefault(report.nodeid, "passed")

    def table(self) -> dict[str, dict[str, object]]:
        out: dict[str, dict[str, object]] = {}
        for row, title in ROWS.items():
            ids = self.tests.get(row, [])
            ran = {i: self.outcome.get(i, "not run") for i in ids}
            failed = [i for i, o in ran.items() if o == "failed"]
            if not ids:
                status = "MISSING"
            elif failed:
                status = "FAIL"
            elif any(o == "passed" for o in ran.values()):
                status = "PASS" if all(o == "passed" for o in ran.values()) else "PASS*"
            elif any(o == "skipped" for o in ran.values()):
                status = "SKIP"
            else:
                status = "NOT RUN"
            out[row] = {"title": title, "status": status, "tests": ran}
        return out

    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001 - pytest type
        if not self.tests:
            return
        table = self.table()
        tr = terminalreporter
        tr.section("reliability matrix")
        missing = [row for row, entry in table.items() if entry["status"] == "MISSING"]
        for row, entry in table.items():
            if row in missing:
                continue
            ran = entry["tests"]
            assert isinstance(ran, dict)
            counts = f"{sum(o == 'passed' for o in ran.values())}/{len(ran)} passed"
            line = f"{row:>4} {entry['status']:<8} {entry['title']:<42} {counts}"
            tr.write_line(line)
            for node, o in ran.items():
                if o != "passed":
                    tr.write_line(f"{'':14}{o}: {node}")
        if missing:
            tr.write_line(f"no test collected in this run for: {', '.join(missing)}")
        if self.json_path:
            Path(self.json_path).write_text(json.dumps(table, indent=1))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reliability-json",
        default=None,
        metavar="PATH",
        help="write the reliability matrix's pass/fail per row to PATH",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(
        ReliabilityReport(config.getoption("--reliability-json")), "reliability-report"
    )
