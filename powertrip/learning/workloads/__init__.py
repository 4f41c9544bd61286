"""The built-in workloads, each declared once as a ``CustomWorkload``: the seam a user's goes
through. ``powertrip.config.workloads.BUILTINS`` names each declaration (``"module:attr"``,
imported on first use), and the settings read its defaults from
``powertrip.config.workload_defaults.WORKLOAD_DEFAULTS`` without importing it.

Adding one: a module here declaring it with ``builtin`` (its data and model), its line in
``BUILTINS`` and its defaults in ``WORKLOAD_DEFAULTS``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

from powertrip.config.workload_defaults import WORKLOAD_DEFAULTS
from powertrip.learning.custom import CustomWorkload, RunSettings
from powertrip.learning.datasets import Dataset, DatasetError

__all__ = ["builtin", "dataset_path"]


def builtin(
    name: str,
    description: str,
    run_data: Callable[[RunSettings, int], Dataset],
    model: Callable[[Dataset], nn.Module] | None = None,
    run_model: Callable[[RunSettings, Dataset], nn.Module] | None = None,
    rank_model: Callable[[RunSettings, Dataset], Callable[[], nn.Module]] | None = None,
) -> CustomWorkload:
    """The built-in workload ``name``, at its default lr and batch (``WORKLOAD_DEFAULTS``, which
    the settings read) and split by the run's ``partition``."""
    defaults = WORKLOAD_DEFAULTS[name]
    return CustomWorkload(
        name=name,
        description=description,
        model=model,
        run_data=run_data,
        run_model=run_model,
        rank_model=rank_model,
        lr=defaults.lr,
        batch_size=defaults.batch_size,
    )


def dataset_path(run: RunSettings) -> Path:
    """The run's dataset path, which a workload of real data needs (the settings check it too)."""
    if run.dataset_path is None:
        raise DatasetError(f"dataset {run.workload!r} needs a path to its files")
    return Path(run.dataset_path)
