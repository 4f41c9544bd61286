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


@pytest.mark.parametrize("quick", [False, True])
def test_every_step_runs_a_program_that_takes_its_flags(tmp_path, quick):
    for step in gpu_check.steps(tmp_path, quick):
        program = step.command[:3] if step.command[1] == "-m" else step.command[:2]
        if program[-1] == "experiment" or Path(program[0]).name == "powertrip":
            program = [*step.command[:1], "experiment"]
        shown = subprocess.run(
            [*program, "--help"], capture_output=True, text=True, cwd=REPO, check=True
        ).stdout
        for flag in (a for a in step.command if re.fullmatch(r"--[a-z][\w-]*", a)):
            assert flag in shown, f"{step.name}: {flag} is not an option of {program}"


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
