from __future__ import annotations

from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tests share two cores with each other's subprocesses; oversubscribed OpenMP crawls."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data samples not found at {SHARED_DATA}")
    return SHARED_DATA


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
