"""The examples in examples/ run as a user would run them and reach what their docs state."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.needs import real_data_path

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TEXT = real_data_path("tinyshakespeare")


def run_example(name: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / name), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def test_own_cnn_on_own_arrays_reaches_80_percent():
    """A BatchNorm + dropout CNN (trained one site at a time, and the log says so) on 8 sites
    holding ~4 label shards each: both policies reach 80% test accuracy within 40 rounds."""
    out = run_example("own_cnn_on_arrays.py")
    assert "training sites one at a time: BatchNorm2d" in out
    for policy in ("powertrip", "select-all"):
        assert re.search(rf"{policy}\s+time to 80%: \d+\.\d+ h", out), out
        final = float(re.search(rf"{policy}\s+final test accuracy (\d\.\d+)", out).group(1))
        assert final >= 0.75, out


@pytest.mark.real_data("tinyshakespeare")
def test_the_language_model_learns_a_text_file():
    """A 2-layer byte-level GPT on 3,000 windows of Shakespeare over 4 sites: validation loss
    from ln(256) = 5.55 at initialisation to below 3.0 in 8 rounds."""
    out = run_example(
        "lm_on_text_file.py",
        "--text",
        str(TEXT),
        "--windows",
        "3000",
        "--rounds",
        "8",
        "--sites",
        "4",
        "--layers",
        "2",
        "--d-model",
        "64",
        "--context",
        "32",
    )
    losses = [float(v) for v in re.findall(r"validation loss (\d+\.\d+)", out)]
    assert len(losses) == 2 and max(losses) < 3.0, out
