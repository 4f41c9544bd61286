"""`powertrip experiment` outside a terminal (logs, CI) reports each finished run on one line,
with the time so far and an ETA, and draws no progress bar."""

from __future__ import annotations

import re

from tests.cli import run_powertrip
from tests.integration.test_cli_experiment import TINY

LINE = re.compile(r"\[(\d+)/(\d+)\] (\S+) \(repeat 1/1\) done \((\d+) s(?:, eta (.+))?\)")


def test_a_log_gets_one_line_per_run_with_an_eta_until_the_last(tmp_path):
    proc = run_powertrip(
        "experiment", *TINY, "--no-plots", "--output", str(tmp_path / "o"), tmp_path=tmp_path
    )
    assert proc.returncode == 0, proc.stderr

    lines = [m for m in map(LINE.fullmatch, proc.stderr.splitlines()) if m]
    runs = [(int(m[1]), int(m[2])) for m in lines]
    total = runs[0][1]
    assert runs == [(i, total) for i in range(1, total + 1)]  # each run once, in order
    assert [m[3] for m in lines][:3] == ["static-2", "static-4", "static-8"]  # the sweep first
    assert all(m[5] for m in lines[:-1]) and lines[-1][5] is None
    assert "━" not in proc.stderr  # no bar
