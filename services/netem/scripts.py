"""Where the link-shaping shell scripts (shape.sh, topology.sh, profiles/) live.

The wheel ships the repository's top-level ``tc-scripts/`` inside this package (hatch
``force-include`` in pyproject.toml), so an installed ``powertrip up --netns-profile`` finds them
wherever it runs; a source checkout or editable install has only the top-level directory.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

PACKAGED = "tc-scripts"  # the directory's name inside services/netem in the wheel


def tc_scripts_dir() -> Path:
    """The directory holding ``topology.sh`` and ``shape.sh``: the packaged copy if installed,
    else the checkout's ``tc-scripts/``."""
    packaged = files(__package__) / PACKAGED
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "tc-scripts"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(
        f"tc-scripts not found: neither {packaged} (installed package) nor {checkout} (checkout)"
    )
