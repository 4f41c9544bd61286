from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import (
    COMPOSE_VARIANTS,
    K8S_VARIANTS,
    kubectl_kustomize,
    load_compose,
    render_kustomize_in_python,
)


@pytest.fixture(scope="session", params=sorted(K8S_VARIANTS))
def k8s_variant(request) -> Path:
    """Every check on the rendered manifests runs for each variant: the default one
    (deploy/k8s), the opt-in curtailment mode (deploy/variants/curtailment), GPU workers
    (deploy/variants/gpu) and a mounted dataset (deploy/variants/dataset)."""
    return K8S_VARIANTS[request.param]


@pytest.fixture(scope="session")
def kustomize_build(k8s_variant) -> list[dict[str, Any]] | None:
    """``kubectl kustomize <variant>`` output, or None when kubectl is not installed."""
    built = kubectl_kustomize(k8s_variant)
    return None if built is None else list(built)


@pytest.fixture(scope="session")
def k8s(kustomize_build, k8s_variant) -> list[dict[str, Any]]:
    """The variant as applied: kustomize's render, else the plain-Python render."""
    if kustomize_build is not None:
        return kustomize_build
    return render_kustomize_in_python(k8s_variant)


@pytest.fixture(scope="session", params=sorted(COMPOSE_VARIANTS))
def compose_files(request) -> tuple[Path, ...]:
    """compose.yaml alone, and with each override (``-f compose.yaml -f compose.X.yaml``)."""
    return COMPOSE_VARIANTS[request.param]


@pytest.fixture(scope="session")
def compose(compose_files) -> dict[str, Any]:
    """The compose files merged, with YAML anchors and merge keys resolved."""
    return load_compose(*compose_files)
