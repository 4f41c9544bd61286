"""Every bad input ends a ``powertrip`` command before anything starts: exit 2, one line on
stderr naming the flag, no traceback, nothing written or started (issue 12, item 6)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli import run_powertrip

# Uncreatable even for root (the tests may run as root, whom a read-only mode does not stop).
UNDER_PROC = "/proc/powertrip-no-such-folder/out"


def refused(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    """The one stderr line of a refused command; it names every one of ``words``."""
    assert proc.returncode == 2, proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def bad_output(tmp_path: Path, kind: str) -> Path:
    """An output folder that cannot be: a file, a folder below a file, one under /proc, or (not
    for root) one inside a read-only folder."""
    (tmp_path / "file").write_text("not a folder")
    if kind == "file":
        return tmp_path / "file"
    if kind == "below-a-file":
        return tmp_path / "file" / "out"
    if kind == "proc":
        return Path(UNDER_PROC)
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    return read_only / "out"


OUTPUT_KINDS = [
    "file",
    "below-a-file",
    "proc",
    pytest.param(
        "read-only",
        marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders"),
    ),
]
COMMANDS = {  # what each command would otherwise start: a study, or the services
    "experiment": ["experiment", "--sites", "4", "--sweep", "2,4", "--target", "0.3"],
    "curtail": ["curtail", "--preset", "curtailment-quick", "--threads", "1"],
    "up": ["up", "--workers", "1", "--sites", "2", "--max-rounds", "1"],
}


@pytest.mark.parametrize("kind", OUTPUT_KINDS)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_output_folder_that_cannot_be_written_is_refused_first(command, kind, tmp_path):
    output = bad_output(tmp_path, kind)
    proc = run_powertrip(*COMMANDS[command], "--output", str(output), tmp_path=tmp_path)
    reason = {"file": "not a folder", "below-a-file": "Not a directory", "proc": "cannot create"}
    refused(proc, "--output", str(output), reason.get(kind, "cannot create"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] + (
        ["read-only"] if kind == "read-only" else []
    )  # no output, no dataset cache: nothing ran
    assert kind != "read-only" or not any((tmp_path / "read-only").iterdir())


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["experiment", "--sites", "4", "--sweep", "2", "--target", "0.3"], "--tensorboard"),
        (["export-tensorboard", "."], "--logdir"),
    ],
)
def test_a_logdir_that_cannot_be_written_is_refused_first(args, flag, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    proc = run_powertrip(*args, flag, str(tmp_path / "file"), tmp_path=tmp_path)
    refused(proc, flag, str(tmp_path / "file"), "not a folder")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--round-min", "0"], "--round-min"),  # was: 100% CPU, never ending
        (["--round-min", "-5"], "--round-min"),
        (["--overhead", "inf"], "--overhead"),
        (["--single-site-hours", "inf"], "--single-site-hours"),  # was: never ending
        (["--hours", "inf"], "--hours"),  # was: a traceback
    ],
)
def test_curtail_refuses_values_that_never_end(args, flag, tmp_path):
    out = tmp_path / "out"
    proc = run_powertrip(
        "curtail",
        "--preset",
        "curtailment-quick",
        *args,
        "--output",
        str(out),
        tmp_path=tmp_path,
        timeout=60,
    )
    refused(proc, flag)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--deadline", "0"], "--deadline"),
        (["--max-rounds", "0"], "--max-rounds"),
        (["--target", "5"], "--target"),
        (["--target", "0"], "--target"),
        (["--timeout", "-1"], "--timeout"),
        (["--workers", "0"], "--workers"),
        # a machine's worth of processes at most: nothing is minted for 100,000 first
        (["--workers", "100000", "--sites", "100000"], "--workers"),
        (["--k-star", "0"], "--k-star"),
        (["--samples", "10"], "--samples"),
        (["--curtail-preset", "nope"], "--curtail-preset"),
        (["--site-ranks", "2", "--workers", "2", "--sites", "4"], "--site-ranks"),
        (["--site-ranks", "65"], "--site-ranks"),
    ],
)
def test_up_refuses_bad_numbers_before_starting_a_service(args, flag, tmp_path):
    out = tmp_path / "up"
    started = time.monotonic()
    proc = run_powertrip("up", *args, "--output", str(out), tmp_path=tmp_path, timeout=60)
    refused(proc, flag)
    assert time.monotonic() - started < 15  # starting the services takes longer
    assert not out.exists() and "started" not in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--policies", "powertrip,static-optimal", "--target", "0.3"],
        ["--policies", "powertrip,random", "--target", "0.3"],
        ["--policies", "powertrip", "--target", "auto"],
    ],
)
def test_a_static_sweep_beyond_the_site_count_is_refused(args, tmp_path):
    out = tmp_path / "out"
    proc = run_powertrip(
        "experiment",
        "--sites",
        "4",
        "--sweep",
        "10,20",
        *args,
        "--output",
        str(out),
        tmp_path=tmp_path,
        timeout=60,
    )
    refused(proc, "--sweep 10,20", "--sites 4")
    assert not out.exists()
