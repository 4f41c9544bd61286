"""A mounted dataset (opt-in) deploys as the services expect it: the k8s component
(deploy/k8s/components/dataset, applied by deploy/variants/dataset) and the compose override
(compose.dataset.yaml) mount one read-only volume at the same path in the aggregator and every
worker (workers rebuild the aggregator's partition from the run's config, path included), set
the workload's env from one file, and leave the hardening alone. Probes, names, required
variables, sites covering the run: the variant-parametrized tests in test_manifests,
test_compose and test_env_drift."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from tests.deploy.support import (
    COMPOSE_DATASET,
    COMPOSE_VARIANTS,
    DATASET_COMPONENT,
    DATASET_ENV,
    DATASET_VARIANT,
    K8S,
    K8S_VARIANTS,
    REPO,
    WORKLOAD_KINDS,
    compose_service_env,
    config_map_data,
    find,
    kubectl_kustomize,
    load_compose,
    load_yaml,
    pod_spec,
    read_env_file,
    render_kustomize_in_python,
)

MOUNT = "/data"
PODS = ("powertrip-aggregator", "powertrip-worker")
TRAINERS = ("aggregator", "worker-eu-west", "worker-us-east", "worker-ap-south")


def k8s(variant: str) -> list[dict[str, Any]]:
    built = kubectl_kustomize(K8S_VARIANTS[variant])
    return list(built) if built is not None else render_kustomize_in_python(K8S_VARIANTS[variant])


def workload(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (w,) = [d for d in docs if d["kind"] in WORKLOAD_KINDS and d["metadata"]["name"] == name]
    return w


def test_the_component_is_opt_in():
    assert "components/dataset" not in load_yaml(K8S / "kustomization.yaml").get("components", [])
    assert load_yaml(DATASET_COMPONENT / "kustomization.yaml")["kind"] == "Component"
    overlay = load_yaml(DATASET_VARIANT / "kustomization.yaml")
    assert overlay["resources"] == ["../../k8s"]
    assert overlay["components"] == ["../../k8s/components/dataset"]
    assert COMPOSE_VARIANTS["dataset"] == (REPO / "compose.yaml", COMPOSE_DATASET)
    assert "POWERTRIP_WORKLOAD" not in config_map_data(k8s("default"))


def test_the_env_names_a_workload_read_from_under_the_mount():
    env = read_env_file(DATASET_ENV)
    assert env["POWERTRIP_WORKLOAD"] == "fsdd" and env["POWERTRIP_PARTITION"] == "natural"
    assert PurePosixPath(MOUNT) in PurePosixPath(env["POWERTRIP_DATASET_PATH"]).parents


def test_k8s_mounts_one_read_only_many_claim_at_data_in_the_aggregator_and_workers():
    docs = k8s("dataset")
    assert config_map_data(docs).items() >= read_env_file(DATASET_ENV).items()
    claims = set()
    for name in PODS:
        spec = pod_spec(workload(docs, name))
        (c,) = spec["containers"]
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == MOUNT]
        assert mount["readOnly"] is True
        (vol,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert vol["persistentVolumeClaim"]["readOnly"] is True
        claims.add(vol["persistentVolumeClaim"]["claimName"])
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert all("hostPath" not in v for v in spec["volumes"])  # restricted Pod Security
    assert claims == {"powertrip-data"}
    pvc = find(docs, "PersistentVolumeClaim", "powertrip-data")
    assert pvc["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert pvc["metadata"]["namespace"] == "powertrip"


def test_k8s_changes_nothing_but_the_mount_the_env_and_the_sites():
    def strip(w: dict[str, Any]) -> dict[str, Any]:
        spec = pod_spec(w)
        (c,) = spec["containers"]
        return {
            "security": (spec.get("securityContext"), c["securityContext"]),
            "mounts": [m for m in c["volumeMounts"] if m["mountPath"] != MOUNT],
            "command": c.get("command"),
            "labels": w["spec"]["template"]["metadata"]["labels"],
        }

    default, dataset = k8s("default"), k8s("dataset")
    for name in PODS:
        assert strip(workload(dataset, name)) == strip(workload(default, name))
    policies = [d for d in default if d["kind"] == "NetworkPolicy"]
    assert [d for d in dataset if d["kind"] == "NetworkPolicy"] == policies


def test_compose_mounts_the_host_folder_read_only_at_data_for_every_trainer():
    services = load_compose(*COMPOSE_VARIANTS["dataset"])["services"]
    default = load_compose(*COMPOSE_VARIANTS["default"])["services"]
    for name in TRAINERS:
        volumes = services[name]["volumes"]
        assert "${POWERTRIP_DATA_DIR:-./data}:/data:ro" in volumes, name
        assert set(default[name]["volumes"]) <= set(volumes), name  # checkpoints, tc-scripts
        assert compose_service_env(services[name]).items() >= read_env_file(DATASET_ENV).items()
    assert "volumes" not in services["profiler"]
