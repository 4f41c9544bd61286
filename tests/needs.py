"""What a test needs beyond a base install (``pip install -e '.[dev]'``): an optional extra or a
real data set. A test that lacks one skips, saying the one command that brings it, so a base
install passes its own tests; CI installs every extra and has the data, so nothing skips there.

Mark a test ``@pytest.mark.extra("speech")`` or ``@pytest.mark.real_data("mnist")`` (the names
of pyproject's extras and of ``powertrip data list``; tests/conftest.py turns a missing one into
a skip at collection). A module that imports an extra at its top uses
``pytest.importorskip(module, reason=extra_reason(...))``; a module-level path ``real_data_path``.
Real data is looked up in one place, ``data_roots``: the project's test data (``../shared/data``,
or ``$POWERTRIP_SHARED_DATA``: point it at a missing folder to see the skips), then the cache
``powertrip data fetch`` fills (``$POWERTRIP_DATA_DIR`` or the per-user cache).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import pytest

from powertrip.fetch import DATASETS, data_dir, get

# The modules each extra of pyproject.toml brings that the tests import.
EXTRAS: dict[str, tuple[str, ...]] = {
    "speech": ("librosa", "soxr"),
    "flower": ("flwr", "ray"),  # flwr[simulation]: ray runs the simulated nodes
    "tensorboard": ("tensorboard",),
}

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def missing_extra(extra: str) -> str | None:
    """The first module of ``extra`` that is not installed, or None (found, not imported: cheap)."""
    for module in EXTRAS[extra]:
        if importlib.util.find_spec(module) is None:
            return module
    return None


def extra_reason(extra: str, module: str) -> str:
    return f"needs the {extra} extra ({module} is not installed): pip install 'powertrip[{extra}]'"


def shared_data_dir() -> Path:
    """The project's own copy of the real data (``$POWERTRIP_SHARED_DATA`` overrides)."""
    return Path(os.environ.get("POWERTRIP_SHARED_DATA") or SHARED_DATA)


def data_roots() -> list[Path]:
    """Folders in the ../shared/data layout (which the fetch cache shares) to look for real data
    in, first match wins: the project's test data, then the cache ``powertrip data fetch`` fills."""
    return [shared_data_dir(), data_dir()]


def find_real_data(name: str) -> Path | None:
    """The root (in the ../shared/data layout) that holds every file of data set ``name``."""
    ds = get(name)  # a KeyError names the known data sets
    return next((root for root in data_roots() if _complete(root / ds.folder, name)), None)


@functools.cache
def _complete(folder: Path, name: str) -> bool:
    return all((folder / f.rel).is_file() for f in get(name).files)


def real_data_reason(name: str) -> str:
    """Why a test without data set ``name`` skips: the command that brings it."""
    fetch = f"powertrip data fetch {name}"
    if get(name).restricted:  # its terms allow no fetch from the public source
        fetch += " --mirror URL|DIR (not fetched from its public source: see powertrip data list)"
    return f"needs the real {name} data, not found: {fetch}"


def real_data_path(name: str) -> Path:
    """Where data set ``name`` is (the path the commands take), for module-level constants; where
    it would be in ../shared/data when it is nowhere, so a test marked ``real_data(name)`` skips."""
    ds = get(name)
    folder = (find_real_data(name) or shared_data_dir()) / ds.folder
    return folder / ds.entry if ds.entry else folder


def real_data(name: str) -> Path:
    """``real_data_path(name)``, or the calling test or fixture skipped, naming the fetch."""
    if find_real_data(name) is None:
        pytest.skip(real_data_reason(name))
    return real_data_path(name)


def data_view(names: list[str], into: Path) -> Path:
    """One root in the ../shared/data layout holding every found data set of ``names``: a root
    that has them all, or links in ``into`` to each one's own root."""
    found = {name: root for name in names if (root := find_real_data(name)) is not None}
    if len(set(found.values())) <= 1:
        return next(iter(found.values()), shared_data_dir())
    for name, root in found.items():
        ds = get(name)
        for f in ds.files:  # file by file: data sets share folders (carbon/)
            link = into / ds.folder / f.rel
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(root / ds.folder / f.rel)
    return into


def real_data_names() -> list[str]:
    return [ds.name for ds in DATASETS]


def data_set_of(rel: str) -> str:
    """The data set holding ``rel`` (a path in the ../shared/data layout), for a skip reason."""
    for ds in DATASETS:
        if any(f"{ds.folder}/{f.rel}" == rel for f in ds.files):
            return ds.name
    raise KeyError(f"no data set holds {rel!r} (powertrip/fetch/sources.py)")
