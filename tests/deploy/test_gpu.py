"""GPU workers (opt-in) deploy as the services expect them: the k8s component
(deploy/k8s/components/gpu, applied by deploy/variants/gpu) and the compose override
(compose.gpu.yaml) give each worker N NVIDIA GPUs and as many site ranks
(POWERTRIP_SITE_RANKS = N, set in one place: gpus.yaml of the k8s overlay, the shell variable
POWERTRIP_SITE_RANKS for compose; 1 by default), a memory-backed /dev/shm, writable
torch.compile caches, the CUDA build of the image and POWERTRIP_DEVICE=cuda, host one site per
worker (a worker with ranks refuses more: POWERTRIP_NUM_SITES=3, the owners map to match), and
change nothing else; the default variants ask for no GPU. Hardening, probes, names, required
variables: the variant-parametrized tests in test_manifests, test_compose and test_env_drift."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import (
    COMPOSE_GPU,
    COMPOSE_VARIANTS,
    CUDA_IMAGE,
    CURTAILMENT_COMPONENT,
    GPU_COMPONENT,
    GPU_VARIANT,
    IMAGE,
    K8S,
    K8S_VARIANTS,
    REPO,
    WORKLOAD_KINDS,
    all_env_vars,
    compose_interpolate,
    compose_service_env,
    config_map_data,
    is_local_config,
    kubectl_kustomize,
    load_compose,
    load_yaml,
    load_yaml_all,
    pod_spec,
    read_env_file,
    render_kustomize_in_python,
)

GPU = "nvidia.com/gpu"
WORKERS = ("worker-eu-west", "worker-us-east", "worker-ap-south")
RANKS = "POWERTRIP_SITE_RANKS"
GPU_ENV_FILE = GPU_COMPONENT / "gpu.env"
COMPILE_CACHES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
#: What the gpu component adds to the worker container's env; the rest is the default's.
GPU_ENV = {"POWERTRIP_DEVICE", RANKS, *COMPILE_CACHES}


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


def gpus(c: dict[str, Any]) -> int:
    return int(c["resources"]["limits"][GPU])


def mounted_volume(docs: list[dict[str, Any]], name: str, path: str) -> dict[str, Any]:
    """The pod volume of ``name``'s container mounted at ``path`` or at a folder above it, and
    the mount."""
    mounts = [
        m
        for m in container(docs, name).get("volumeMounts", [])
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert mounts, f"nothing mounted at {path}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volumes = {v["name"]: v for v in pod_spec(workload(docs, name)).get("volumes", [])}
    return {**volumes[mount["name"]], "mount": mount}


def overlay(tmp_path: Path, ranks: str, components: tuple[Path, ...] = ()) -> Path:
    """An overlay as deploy/README.md shows it: the default variant, the gpu component (after
    ``components``) and its own gpus.yaml, in a folder outside the repo."""
    root = tmp_path / "overlay"
    root.mkdir()

    def rel(path: Path) -> str:
        return os.path.relpath(path, root)

    gpus = (GPU_VARIANT / "gpus.yaml").read_text()
    (root / "gpus.yaml").write_text(re.sub(r'ranks: "1"', f'ranks: "{ranks}"', gpus))
    listed = "".join(f"  - {rel(c)}\n" for c in (*components, GPU_COMPONENT))
    (root / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {rel(K8S)}\n  - gpus.yaml\ncomponents:\n{listed}"
    )
    return root


def renders(root: Path) -> list[list[dict[str, Any]]]:
    """``root`` rendered by the Python renderer and, when installed, by kubectl kustomize."""
    built = kubectl_kustomize(root)
    return [render_kustomize_in_python(root), *([list(built)] if built is not None else [])]


def test_the_component_is_opt_in():
    root = load_yaml(K8S / "kustomization.yaml")
    assert "components/gpu" not in root.get("components", [])
    assert load_yaml(GPU_COMPONENT / "kustomization.yaml")["kind"] == "Component"
    overlay = load_yaml(GPU_VARIANT / "kustomization.yaml")
    # The default variant, whatever it holds, and N (a local-config ConfigMap, not applied).
    assert overlay["resources"] == ["../../k8s", "gpus.yaml"]
    assert overlay["components"] == ["../../k8s/components/gpu"]
    (gpus,) = load_yaml_all((GPU_VARIANT / "gpus.yaml").read_text())
    assert gpus["kind"] == "ConfigMap" and is_local_config(gpus)
    assert gpus["data"] == {"ranks": "1"}  # a cluster of 1-GPU nodes schedules it
    assert COMPOSE_VARIANTS["gpu"] == (REPO / "compose.yaml", COMPOSE_GPU)


@pytest.mark.parametrize("variant", ["default", "curtailment"])
def test_other_variants_ask_for_no_gpu(variant):
    docs = k8s(variant)
    for w in (d for d in docs if d["kind"] in WORKLOAD_KINDS):
        for c in pod_spec(w)["containers"]:
            assert GPU not in c["resources"].get("limits", {}), w["metadata"]["name"]
            assert image_name(c) != CUDA_IMAGE
            assert RANKS not in env_values(c)  # the in-process engine (0), the default
    for name, service in load_compose(*COMPOSE_VARIANTS[variant])["services"].items():
        assert "deploy" not in service, name
        assert RANKS not in (service.get("environment") or {}), name


def test_k8s_gpu_workers_get_one_gpu_on_a_gpu_node_and_train_on_it():
    docs = k8s("gpu")
    spec = pod_spec(workload(docs, "powertrip-worker"))
    c = container(docs, "powertrip-worker")
    assert gpus(c) == 1
    assert int(env_values(c)[RANKS]) == 1  # one rank per GPU
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


def unhashed(name: str) -> str:
    return re.sub(r"-[a-z0-9]{10}$", "", name)  # kustomize's content-hash suffix


def object_key(d: dict[str, Any]) -> tuple[str, str]:
    name = d["metadata"]["name"]
    return d["kind"], unhashed(name) if d["kind"] == "ConfigMap" else name


def without_site_layout(w: dict[str, Any]) -> dict[str, Any]:
    """A workload less what the gpu component may change outside the workers: the owners map,
    and the ConfigMap's hash suffix (its POWERTRIP_NUM_SITES)."""
    w = copy.deepcopy(w)
    for c in pod_spec(w)["containers"]:
        c["env"] = [e for e in c.get("env", []) if e["name"] != "POWERTRIP_SITE_OWNERS"]
        for source in c.get("envFrom", []):
            if "configMapRef" in source:
                source["configMapRef"]["name"] = unhashed(source["configMapRef"]["name"])
    return w


def test_k8s_gpu_variant_changes_only_the_workers_and_their_layout():
    gpu, default = k8s("gpu"), k8s("default")
    assert sorted(object_key(d) for d in gpu) == sorted(object_key(d) for d in default)
    for name in ("powertrip-aggregator", "powertrip-profiler"):
        assert without_site_layout(workload(gpu, name)) == without_site_layout(
            workload(default, name)
        )
        assert image_name(container(gpu, name)) == IMAGE
    # A worker with ranks trains one site: one site per worker, the owners map to match (the
    # layout itself: test_manifests), and no other setting.
    assert config_map_data(gpu) == {**config_map_data(default), "POWERTRIP_NUM_SITES": "3"}
    assert read_env_file(GPU_ENV_FILE) == {"POWERTRIP_NUM_SITES": "3"}
    owners = env_values(container(gpu, "powertrip-aggregator"))["POWERTRIP_SITE_OWNERS"]
    assert owners == "powertrip-worker-0=0;powertrip-worker-1=1;powertrip-worker-2=2"
    workers = [workload(docs, "powertrip-worker") for docs in (gpu, default)]
    assert workers[0]["spec"]["replicas"] == workers[1]["spec"]["replicas"] == 3
    env = [env_values(container(docs, "powertrip-worker")) for docs in (gpu, default)]
    assert env[0]["SITES_PER_WORKER"] == "1"
    layout = {*GPU_ENV, "SITES_PER_WORKER"}
    assert {k: v for k, v in env[0].items() if k not in layout} == {
        k: v for k, v in env[1].items() if k != "SITES_PER_WORKER"
    }
    # The hardening and the network: same security contexts, same policies.
    spec = [pod_spec(w) for w in workers]
    assert spec[0]["securityContext"] == spec[1]["securityContext"]
    assert (
        container(gpu, "powertrip-worker")["securityContext"]
        == (container(default, "powertrip-worker")["securityContext"])
    )
    assert container(gpu, "powertrip-worker")["securityContext"]["readOnlyRootFilesystem"]
    policies = [
        sorted(
            (d for d in docs if d["kind"] == "NetworkPolicy"), key=lambda d: d["metadata"]["name"]
        )
        for docs in (gpu, default)
    ]
    assert policies[0] == policies[1]


def test_gpu_env_sets_only_config_fields():
    assert set(read_env_file(GPU_ENV_FILE)) <= all_env_vars()


def test_k8s_gpu_limit_is_the_site_ranks_in_both_renders():
    # The Python render too: it is what runs where kubectl is absent.
    for docs in renders(GPU_VARIANT):
        c = container(docs, "powertrip-worker")
        assert gpus(c) == int(env_values(c)[RANKS]) == 1
        assert not [d for d in docs if is_local_config(d)]  # gpus.yaml is not applied


@pytest.mark.parametrize("n", [4, 8])
def test_an_overlay_sets_n_once_for_the_gpus_and_the_ranks(tmp_path, n):
    for docs in renders(overlay(tmp_path, str(n))):
        c = container(docs, "powertrip-worker")
        assert gpus(c) == int(env_values(c)[RANKS]) == n
        assert int(c["resources"].get("requests", {}).get(GPU, n)) == n


def test_an_overlay_combines_the_gpu_and_curtailment_components(tmp_path):
    for docs in renders(overlay(tmp_path, "4", (CURTAILMENT_COMPONENT,))):
        c = container(docs, "powertrip-worker")
        assert gpus(c) == int(env_values(c)[RANKS]) == 4
        assert env_values(c)["SITES_PER_WORKER"] == "1"  # curtailment's


def test_k8s_gpu_workers_get_a_memory_backed_dev_shm():
    volume = mounted_volume(k8s("gpu"), "powertrip-worker", "/dev/shm")
    assert volume["mount"]["mountPath"] == "/dev/shm"
    assert volume["emptyDir"]["medium"] == "Memory"
    assert volume["emptyDir"]["sizeLimit"]  # counts against the memory limit: bounded
    c = container(k8s("gpu"), "powertrip-worker")
    assert "memory" in c["resources"]["limits"]


@pytest.mark.parametrize("variable", COMPILE_CACHES)
def test_k8s_gpu_compile_caches_are_on_a_writable_volume(variable):
    docs = k8s("gpu")
    path = env_values(container(docs, "powertrip-worker"))[variable]
    volume = mounted_volume(docs, "powertrip-worker", path)
    assert volume["mount"]["mountPath"] != "/dev/shm"  # not in the ranks' shared memory
    assert "emptyDir" in volume and volume["emptyDir"].get("medium") != "Memory"
    assert volume["emptyDir"]["sizeLimit"]
    assert not volume["mount"].get("readOnly")


def reserved_gpus(service: dict[str, Any], variables: dict[str, str]) -> int:
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    if "device_ids" in device:
        return len(device["device_ids"])
    return int(compose_interpolate(str(device["count"]), variables))


@pytest.mark.parametrize("name", WORKERS)
def test_compose_gpu_workers_reserve_an_nvidia_gpu_and_train_on_it(name):
    service = load_compose(*COMPOSE_VARIANTS["gpu"])["services"][name]
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert reserved_gpus(service, {}) == 1  # by default
    assert compose_interpolate(service["image"]) == f"{CUDA_IMAGE}:dev"
    published = compose_interpolate(service["image"], {"POWERTRIP_CUDA_IMAGE": "reg/p:0.1-cu126"})
    assert published == "reg/p:0.1-cu126"
    assert service["build"]["args"]["TORCH_INDEX"].startswith("cu")
    assert service["environment"]["POWERTRIP_DEVICE"] == "cuda"
    assert "POWERTRIP_SITES" in service["environment"]  # merged with compose.yaml's, not replaced
    assert not service.get("privileged") and "devices" not in service
    assert "NVIDIA_VISIBLE_DEVICES" not in service["environment"]


@pytest.mark.parametrize("variables", [{}, {RANKS: "4"}, {RANKS: "8"}])
@pytest.mark.parametrize("name", WORKERS)
def test_compose_gpu_workers_run_one_rank_per_reserved_gpu(name, variables):
    # One shell variable (POWERTRIP_SITE_RANKS, default 1) sets both.
    service = load_compose(*COMPOSE_VARIANTS["gpu"])["services"][name]
    ranks = compose_service_env(service, variables)[RANKS]
    assert int(ranks) == reserved_gpus(service, variables) == int(variables.get(RANKS, 1))


def shm_bytes(size: str) -> int:
    number, unit = re.fullmatch(r"(\d+)\s*([kmg]?)b?", str(size).lower()).groups()
    return int(number) * 1024 ** " kmg".index(unit or " ")


@pytest.mark.parametrize("name", WORKERS)
def test_compose_gpu_workers_get_shm_and_writable_compile_caches(name):
    service = load_compose(*COMPOSE_VARIANTS["gpu"])["services"][name]
    assert shm_bytes(service["shm_size"]) >= 1024**3  # NCCL wants far more than Docker's 64 MiB
    assert service["read_only"] is True  # compose.yaml's hardening stays
    tmpfs = dict(t.partition(":")[::2] for t in service["tmpfs"])
    assert "/tmp" in tmpfs  # compose.yaml's, kept (docker adds the lists; this loader replaces)
    env = compose_service_env(service)
    for variable in COMPILE_CACHES:
        (mount,) = [m for m in tmpfs if env[variable].startswith(m.rstrip("/") + "/")]
        # Compiled kernels are shared objects, loaded from there: Docker's tmpfs is noexec
        # unless told otherwise.
        assert "exec" in tmpfs[mount].split(","), variable


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_compose_gpu_override_changes_only_the_workers_and_their_layout():
    gpu = load_compose(*COMPOSE_VARIANTS["gpu"])["services"]
    default = load_compose(*COMPOSE_VARIANTS["default"])["services"]
    assert sorted(gpu) == sorted(default)
    for name in set(default) - set(WORKERS) - {"aggregator", "profiler"}:
        assert gpu[name] == default[name], name
    # The gpu env file after the shared one (one site per worker), the owners map to match.
    for name in ("aggregator", "profiler"):
        ours, theirs = (
            {**s[name], "environment": dict(s[name].get("environment") or {})}
            for s in (gpu, default)
        )
        assert ours.pop("env_file") == [theirs.pop("env_file"), rel(GPU_ENV_FILE)]
        ours["environment"].pop("POWERTRIP_SITE_OWNERS", None)
        theirs["environment"].pop("POWERTRIP_SITE_OWNERS", None)
        assert ours == theirs, name
    owners = gpu["aggregator"]["environment"]["POWERTRIP_SITE_OWNERS"]
    assert owners == "worker-eu-west=0;worker-us-east=1;worker-ap-south=2"
    assert [gpu[w]["environment"]["POWERTRIP_SITES"] for w in WORKERS] == ["0", "1", "2"]


def test_readmes_document_every_way_in():
    deploy = (REPO / "deploy" / "README.md").read_text()
    assert "kubectl apply -k deploy/variants/gpu" in deploy
    assert "-f compose.yaml -f compose.gpu.yaml" in deploy
    assert "--build-arg TORCH_INDEX=" in deploy
    assert "## A site that is a GPU cluster" in deploy
    assert "POWERTRIP_SITE_RANKS=4 docker compose" in deploy
    assert 'ranks: "8"' in deploy or 'ranks: "4"' in deploy  # an overlay setting N
    readme = (REPO / "README.md").read_text()
    assert "## GPU" in readme and "POWERTRIP_DEVICE" in readme
