"""Running the ``powertrip`` command as a user would, for the CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_powertrip(
    *args: str, tmp_path: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``powertrip ARGS`` in a subprocess from the checkout, with its own dataset cache and one
    OpenMP thread (runs stay comparable on a shared machine)."""
    env = {**os.environ, "POWERTRIP_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "powertrip.services.cli.main", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
