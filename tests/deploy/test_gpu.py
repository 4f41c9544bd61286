"""GPU workers (opt-in) deploy as the services expect them: the k8s component
(deploy/k8s/components/gpu, applied by deploy/variants/gpu) and the compose override
(compose.gpu.yaml) give each worker one NVIDIA GPU, the CUDA build of the image and
POWERTRIP_DEVICE=cuda, and change nothing else; the default variants ask for no GPU. Hardening,
probes, names, required variables: the variant-parametrized tests in test_manifests,
test_compose and test_env_drift."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.support import (
    COMPOSE_GPU,
    COMPOSE_VARIANTS,
    CUDA_IMAGE,
    GPU_COMPONENT,
    GPU_VARIANT,
    IMAGE,
    K8S,
    K8S_VARIANTS,
    REPO,
    WORKLOAD_KINDS,
    kubectl_kustomize,
    load_compose,
    load_yaml,
    pod_spec,
    render_kustomize_in_python,
)

GPU = "nvidia.com/gpu"
WORKERS = ("worker-eu-west", "worker-us-east", "worker-ap-south")


def k8s(variant: str) -> list[dict[str, Any]]:
    built = kubectl_kustomize(K8S_VARIANTS[variant])
    return list(built) if built is not None else render_kustomize_in_python(K8S_VARIANTS[variant])


def workload(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (w,) = [d for d in docs if d["kind"] in WORKLOAD_KINDS and d["metadata"]["name"] == name]
    return w


def container(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (c,) = pod_spec(workload(docs, name))["containers"]
    return c


def env_values(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def image_name(c: dict[str, Any]) -> str:
    return c["image"].split(":")[0]


def test_the_component_is_opt_in():
    root = load_yaml(K8S / "kustomization.yaml")
    assert "components/gpu" not in root.get("components", [])
    assert load_yaml(GPU_COMPONENT / "kustomization.yaml")["kind"] == "Component"
    overlay = load_yaml(GPU_VARIANT / "kustomization.yaml")
    assert overlay["resources"] == ["../../k8s"]  # the default variant, whatever it holds
    assert overlay["components"] == ["../../k8s/components/gpu"]
    assert COMPOSE_VARIANTS["gpu"] == (REPO / "compose.yaml", COMPOSE_GPU)


@pytest.mark.parametrize("variant", ["default", "curtailment"])
def test_other_variants_ask_for_no_gpu(variant):
    docs = k8s(variant)
    for w in (d for d in docs if d["kind"] in WORKLOAD_KINDS):
        for c in pod_spec(w)["containers"]:
            assert GPU not in c["resources"].get("limits", {}), w["metadata"]["name"]
            assert image_name(c) != CUDA_IMAGE
    for name, service in load_compose(*COMPOSE_VARIANTS[variant])["services"].items():
        assert "deploy" not in service, name


def test_k8s_gpu_workers_get_one_gpu_on_a_gpu_node_and_train_on_it():
    docs = k8s("gpu")
    spec = pod_spec(workload(docs, "powertrip-worker"))
    c = container(docs, "powertrip-worker")
    assert int(c["resources"]["limits"][GPU]) == 1
    # An extended resource cannot be overcommitted: a request, if any, must equal the limit.
    assert int(c["resources"].get("requests", {}).get(GPU, 1)) == 1
    assert {"cpu", "memory"} <= set(c["resources"]["limits"])  # the patch merges, not replaces
    assert spec["nodeSelector"]
    assert any(
        t["key"] == GPU and t["operator"] == "Exists" and t["effect"] == "NoSchedule"
        for t in spec["tolerations"]
    )
    assert image_name(c) == CUDA_IMAGE
    assert env_values(c)["POWERTRIP_DEVICE"] == "cuda"


def test_k8s_gpu_reaches_the_worker_only_through_the_device_plugin():
    # No host devices or driver paths mounted, no variable that bypasses the allocation.
    docs = k8s("gpu")
    w = workload(docs, "powertrip-worker")
    assert not [v for v in pod_spec(w).get("volumes", []) if "hostPath" in v]
    assert "NVIDIA_VISIBLE_DEVICES" not in env_values(container(docs, "powertrip-worker"))


def test_k8s_gpu_variant_changes_only_the_workers():
    gpu, default = k8s("gpu"), k8s("default")
    assert sorted((d["kind"], d["metadata"]["name"]) for d in gpu) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in default
    )
    for name in ("powertrip-aggregator", "powertrip-profiler"):
        assert workload(gpu, name) == workload(default, name)
        assert image_name(container(gpu, name)) == IMAGE
    # The site layout stays the default's: replicas, sites per worker, shared settings.
    workers = [workload(docs, "powertrip-worker") for docs in (gpu, default)]
    assert workers[0]["spec"]["replicas"] == workers[1]["spec"]["replicas"]
    env = [env_values(container(docs, "powertrip-worker")) for docs in (gpu, default)]
    assert {k: v for k, v in env[0].items() if k != "POWERTRIP_DEVICE"} == env[1]


@pytest.mark.parametrize("name", WORKERS)
def test_compose_gpu_workers_reserve_an_nvidia_gpu_and_train_on_it(name):
    service = load_compose(*COMPOSE_VARIANTS["gpu"])["services"][name]
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert device.get("count") == 1 or len(device.get("device_ids", [])) == 1
    assert service["image"] == f"{CUDA_IMAGE}:dev"
    assert service["build"]["args"]["TORCH_INDEX"].startswith("cu")
    assert service["environment"]["POWERTRIP_DEVICE"] == "cuda"
    assert "POWERTRIP_SITES" in service["environment"]  # merged with compose.yaml's, not replaced
    assert not service.get("privileged") and "devices" not in service
    assert "NVIDIA_VISIBLE_DEVICES" not in service["environment"]


def test_compose_gpu_override_changes_only_the_workers():
    gpu = load_compose(*COMPOSE_VARIANTS["gpu"])["services"]
    default = load_compose(*COMPOSE_VARIANTS["default"])["services"]
    assert sorted(gpu) == sorted(default)
    for name in set(default) - set(WORKERS):
        assert gpu[name] == default[name], name


def test_readmes_document_every_way_in():
    deploy = (REPO / "deploy" / "README.md").read_text()
    assert "kubectl apply -k deploy/variants/gpu" in deploy
    assert "-f compose.yaml -f compose.gpu.yaml" in deploy
    assert "--build-arg TORCH_INDEX=" in deploy
    readme = (REPO / "README.md").read_text()
    assert "## GPU" in readme and "POWERTRIP_DEVICE" in readme
