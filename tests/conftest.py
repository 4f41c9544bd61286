from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.needs import (
    EXTRAS,
    data_view,
    extra_reason,
    find_real_data,
    missing_extra,
    real_data_names,
    real_data_reason,
)

# Every child process (services, examples, benchmarks, CLI runs) trains on one thread: the tests
# run on several xdist workers over two cores, where torch's one-thread-per-core default
# oversubscribes them. A test that needs more threads sets them itself.
os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["pytester"]  # tests/unit/test_needs.py runs marked tests under this conftest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "extra(name, ...): needs an optional extra of pyproject.toml (tests/needs.py)"
    )
    config.addinivalue_line(
        "markers", "real_data(name, ...): needs data sets `powertrip data fetch` obtains"
    )


def _why_skip(item: pytest.Item) -> str | None:
    """Why ``item`` cannot run here (the first extra or data set it lacks), or None."""
    for mark in item.iter_markers("extra"):
        for extra in mark.args:
            if extra not in EXTRAS:
                raise pytest.UsageError(
                    f"{item.nodeid}: unknown extra {extra!r} ({sorted(EXTRAS)})"
                )
            if (module := missing_extra(extra)) is not None:
                return extra_reason(extra, module)
    names = [name for mark in item.iter_markers("real_data") for name in mark.args]
    for name in names:
        if name not in real_data_names():
            raise pytest.UsageError(
                f"{item.nodeid}: unknown real_data {name!r} ({', '.join(real_data_names())})"
            )
        if find_real_data(name) is None:
            return real_data_reason(name)
    return None


def pytest_collection_modifyitems(config, items):
    """Skips decided at collection, before any fixture of a test that cannot run is set up."""
    for item in items:
        if (why := _why_skip(item)) is not None:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tests share two cores with each other's subprocesses; oversubscribed OpenMP crawls."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shared_data(tmp_path_factory) -> Path:
    """A folder in the ../shared/data layout with every real data set found. A test that uses it
    says which it needs with ``@pytest.mark.real_data(...)``, or skips by itself (naming the
    fetch: ``tests.needs.real_data_reason``) where only part of it needs the data."""
    return data_view(real_data_names(), tmp_path_factory.mktemp("real-data"))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp() / "powertrip-cache"
    monkeypatch.setenv("POWERTRIP_CACHE_DIR", str(cache))


@pytest.fixture(autouse=True, scope="session")
def _plaintext_services_by_default():
    """Services refuse plaintext unless POWERTRIP_INSECURE=1 (docs/security.md). Most tests
    start services in-process or as children that read this environment and talk plaintext to
    them; the TLS and identity tests give certificates (and remove this) explicitly. Session
    scope, so module-scoped fixtures that start services see it too."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POWERTRIP_INSECURE", "1")
        yield
