"""The one-command GPU check cannot run here (no GPU in CI), so what can rot without one is
checked on the CPU: every step names a program that exists and accepts each flag it is given,
and without CUDA the check says so and exits 2 instead of reporting a table of failures."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check

REPO = Path(__file__).resolve().parents[2]


def program_of(command: list[str]) -> tuple[str, ...]:
    if Path(command[0]).name == "powertrip":
        return (command[0], "experiment")
    return tuple(command[:3] if command[1] == "-m" else command[:2])


def test_every_step_runs_a_program_that_takes_its_flags(tmp_path):
    flags: dict[tuple[str, ...], set[str]] = {}
    for step in [*gpu_check.steps(tmp_path, False), *gpu_check.steps(tmp_path, True)]:
        given = {a for a in step.command if re.fullmatch(r"--[a-z][\w-]*", a)}
        flags.setdefault(program_of(step.command), set()).update(given)
    helps = {  # every program's --help at once: each one is mostly torch's import
        p: subprocess.Popen([*p, "--help"], stdout=subprocess.PIPE, text=True, cwd=REPO)
        for p in flags
    }
    for program, proc in helps.items():
        shown, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, program
        missing = sorted(f for f in flags[program] if f not in shown)
        assert not missing, f"{program} has no option {missing}"


def test_the_cuda_tests_step_selects_the_registered_gpu_marker():
    (tests,) = [s for s in gpu_check.steps(Path("."), False) if s.name == "cuda tests"]
    assert tests.command[tests.command.index("-m", 2) + 1] == "gpu"
    assert '"gpu:' in (REPO / "pyproject.toml").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_the_check_says_so_and_exits_2(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "no CUDA device" in done.stdout
