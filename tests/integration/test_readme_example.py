"""The README's Python example runs as written and prints one line per policy."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _readme_python_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## From Python") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's 'From Python' section has no python block"
    return match.group(1)


def test_the_example_is_at_most_ten_lines():
    code = [line for line in _readme_python_block().splitlines() if line.strip()]
    assert len(code) <= 10


@pytest.mark.slow
def test_the_readme_example_runs_a_small_study(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(_readme_python_block())
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # shared CI cores: one thread is fastest
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("target accuracy 0.45")
    policies = [line.split()[0] for line in lines[1:]]
    assert policies == list(dict.fromkeys(policies)) and "powertrip" in policies
    assert all(re.search(r"sites/round$", line) for line in lines[1:])
