"""A study's progress as a user sees it. Outside a terminal (logs, CI) ``powertrip experiment``
and ``powertrip curtail`` print the data preparation's steps, the first round at once, then a
line on the latest round at most every 10 s, and each finished run on one line with the time so
far and an ETA, and draw no bar; on a terminal the bar shows the run, its round and the ETA."""

from __future__ import annotations

import re

from tests.cli import run_powertrip
from tests.integration.test_cli_curtail import SMALL
from tests.integration.test_cli_curtail import powertrip as run_curtail
from tests.integration.test_cli_experiment import TINY

LINE = re.compile(r"\[(\d+)/(\d+)\] (\S+) \(repeat 1/1\) done \((\d+) s(?:, eta (.+))?\)")
ROUND = re.compile(
    r"\[(\d+)/(\d+)\] (\S+) \(repeat 1/1\) round (\d+)/5, clock .+, accuracy 0\.\d{3} \(.+\)"
)
EVERY_S = 10  # services/cli/progress.py: off a terminal, a line at most this often


def _wall_s(lines: list[re.Match[str]]) -> int:
    return int(lines[-1][4])


def test_a_log_gets_the_data_steps_some_rounds_and_one_line_per_run_with_an_eta(tmp_path):
    proc = run_powertrip(
        "experiment", *TINY, "--no-plots", "--output", str(tmp_path / "o"), tmp_path=tmp_path
    )
    assert proc.returncode == 0, proc.stderr

    err = proc.stderr.splitlines()
    lines = [m for m in map(LINE.fullmatch, err) if m]
    runs = [(int(m[1]), int(m[2])) for m in lines]
    total = runs[0][1]
    assert runs == [(i, total) for i in range(1, total + 1)]  # each run once, in order
    assert [m[3] for m in lines][:3] == ["static-2", "static-4", "static-8"]  # the sweep first
    assert all(m[5] for m in lines[:-1]) and lines[-1][5] is None
    assert "━" not in proc.stderr  # no bar

    rounds = [m for m in map(ROUND.fullmatch, err) if m]
    assert rounds and rounds[0].groups()[:4] == ("1", str(total), "static-2", "1")  # at once
    assert len(rounds) <= 1 + _wall_s(lines) // EVERY_S + 1  # then at a bounded rate
    data = [line for line in err if line.startswith("mnist1d: generating")]  # a fresh cache
    assert len(data) == 2 and data[0].endswith("started (0 s)") and "done" in data[1]


def test_a_terminal_gets_a_bar_with_the_run_and_the_eta(tmp_path, monkeypatch):
    """Two runs: the bar is drawn as each run ends (and four times a second), so a frame shows
    the ETA however fast the machine."""
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich draws as on a terminal (rich's documented way)
    monkeypatch.setenv("COLUMNS", "160")
    two_runs = [*TINY, "--policies", "powertrip,centralized-25", "--num-samples", "2000"]
    proc = run_powertrip(
        "experiment", *two_runs, "--no-plots", "--output", str(tmp_path / "o"), tmp_path=tmp_path
    )
    assert proc.returncode == 0, proc.stderr

    frames = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", proc.stderr).replace("\r", "\n")
    assert "━" in frames  # the bar
    assert re.search(r"\[1/2\] powertrip \(repeat 1/1\).* \d+% .*eta \d+ (s|min)", frames)
    assert not LINE.search(frames)  # no log lines on a terminal


def test_curtail_in_a_log_shows_rounds_and_each_run_without_a_flood(tmp_path):
    proc = run_curtail(
        *SMALL,
        "--policies",
        "curtailment",
        "--no-plots",
        "--output",
        str(tmp_path / "o"),
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr

    err = proc.stderr.splitlines()
    done = [m for m in (re.fullmatch(r"\[\d/3\] (\S+) done \((\d+) s.*\)", x) for x in err) if m]
    assert [m[1] for m in done] == ["curtailment", "always-on-fl", "single-site"]
    rounds = [line for line in err if re.search(r"\] \S+ round \d+, data \d+%, clock ", line)]
    assert rounds and rounds[0].startswith("[1/3] curtailment round 1, data ")
    assert len(rounds) <= 1 + int(done[-1][2]) // EVERY_S + 1  # not one per round
