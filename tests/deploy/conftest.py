from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.deploy.support import (
    COMPOSE,
    K8S,
    load_yaml,
    load_yaml_all,
    render_kustomize_in_python,
    tool,
)


@pytest.fixture(scope="session")
def kustomize_build() -> list[dict[str, Any]] | None:
    """``kubectl kustomize deploy/k8s`` output, or None when kubectl is not installed."""
    kubectl = tool("kubectl")
    if kubectl is None:
        return None
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, f"kubectl kustomize deploy/k8s failed:\n{out.stderr}"
    return load_yaml_all(out.stdout)


@pytest.fixture(scope="session")
def k8s(kustomize_build) -> list[dict[str, Any]]:
    """The default variant as applied: kustomize's render, else the plain-Python render."""
    return kustomize_build if kustomize_build is not None else render_kustomize_in_python()


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    """compose.yaml with YAML anchors and merge keys resolved."""
    return load_yaml(COMPOSE)
