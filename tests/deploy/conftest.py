from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import (
    COMPOSE_VARIANTS,
    K8S_VARIANTS,
    load_compose,
    load_yaml_all,
    render_kustomize_in_python,
    tool,
)


@pytest.fixture(scope="session", params=sorted(K8S_VARIANTS))
def k8s_variant(request) -> Path:
    """Every check on the rendered manifests runs for each variant: the default one
    (deploy/k8s) and the opt-in curtailment mode (deploy/variants/curtailment)."""
    return K8S_VARIANTS[request.param]


@pytest.fixture(scope="session")
def kustomize_build(k8s_variant) -> list[dict[str, Any]] | None:
    """``kubectl kustomize <variant>`` output, or None when kubectl is not installed."""
    kubectl = tool("kubectl")
    if kubectl is None:
        return None
    out = subprocess.run(
        [kubectl, "kustomize", str(k8s_variant)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, f"kubectl kustomize {k8s_variant} failed:\n{out.stderr}"
    return load_yaml_all(out.stdout)


@pytest.fixture(scope="session")
def k8s(kustomize_build, k8s_variant) -> list[dict[str, Any]]:
    """The variant as applied: kustomize's render, else the plain-Python render."""
    if kustomize_build is not None:
        return kustomize_build
    return render_kustomize_in_python(k8s_variant)


@pytest.fixture(scope="session", params=sorted(COMPOSE_VARIANTS))
def compose_files(request) -> tuple[Path, ...]:
    """compose.yaml alone, and with the curtailment override (``-f compose.yaml -f ...``)."""
    return COMPOSE_VARIANTS[request.param]


@pytest.fixture(scope="session")
def compose(compose_files) -> dict[str, Any]:
    """The compose files merged, with YAML anchors and merge keys resolved."""
    return load_compose(*compose_files)
