"""compose.yaml: local multi-site emulation with the same config, names and files as k8s; every
check runs on compose.yaml alone and with each override (compose.curtailment.yaml,
compose.gpu.yaml)."""

from __future__ import annotations

import subprocess
import sys
from concurrent import futures
from typing import Any

import pytest

from tests.deploy.support import (
    COMPOSE_VARIANTS,
    CUDA_IMAGE,
    DASHBOARDS,
    IMAGE,
    K8S_VARIANTS,
    MONITORING,
    REPO,
    SHARED_ENV,
    WORKLOAD_KINDS,
    compose_interpolate,
    compose_service_env,
    find,
    kubectl_kustomize,
    load_compose,
    service_of_command,
    tool,
)

WORKERS = ("worker-eu-west", "worker-us-east", "worker-ap-south")
APP_SERVICES = ("aggregator", "profiler", *WORKERS)
SERVICES = (*APP_SERVICES, "prometheus", "grafana")
SHARED_ENV_FILE = str(SHARED_ENV.relative_to(REPO))


def svc(compose: dict[str, Any], name: str) -> dict[str, Any]:
    return compose["services"][name]


def as_list(value: str | list[str] | None) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def aliases(service: dict[str, Any]) -> list[str]:
    return service.get("networks", {}).get("default", {}).get("aliases", [])


def bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> host path (relative to the repo) of the bind mounts."""
    out = {}
    for spec in service.get("volumes", []):
        source, target = spec.split(":")[:2]
        if source.startswith("./"):
            out[target] = source.removeprefix("./")
    return out


def compose_tool() -> list[str] | None:
    docker = tool("docker")
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = tool("docker-compose")
    return [legacy] if legacy else None


def test_compose_config_is_valid(compose_files):
    command = compose_tool()
    if command is None:
        pytest.skip("neither `docker compose` nor `docker-compose` installed")
    out = subprocess.run(
        [*command, *(arg for f in compose_files for arg in ("-f", str(f))), "config", "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_compose_runs_the_style_guide_services(compose):
    assert sorted(compose["services"]) == sorted(SERVICES)


@pytest.mark.parametrize("name", SERVICES)
def test_compose_service_has_a_healthcheck_and_restarts_on_failure(compose, name):
    service = svc(compose, name)
    check = service["healthcheck"]
    assert not check.get("disable") and check["test"] and check["test"] != ["NONE"]
    assert service["restart"] == "on-failure"


@pytest.mark.parametrize("name", APP_SERVICES)
def test_compose_app_service_runs_the_image_with_the_shared_env_file(compose, name):
    service = svc(compose, name)
    # The image built from this repo's Dockerfile: the CPU build, or the CUDA one by build arg
    # (by default: the shell's POWERTRIP_IMAGE may name a published one, see below).
    image, build = compose_interpolate(service["image"]), service["build"]
    if image == f"{IMAGE}:dev":
        assert build == "."
    else:
        assert image == f"{CUDA_IMAGE}:dev", image
        assert build["context"] == "." and "dockerfile" not in build
        assert build["args"]["TORCH_INDEX"].startswith("cu")
    assert service_of_command(service["command"]) == name.split("-")[0]
    # The shared settings first; a variant's own env file (later wins) may follow.
    env_files = as_list(service["env_file"])
    assert env_files[0] == SHARED_ENV_FILE and len(set(env_files)) == len(env_files)
    assert all((REPO / f).is_file() for f in env_files)
    # Mirrors readOnlyRootFilesystem in k8s: a write outside /tmp and volumes fails locally too.
    assert service["read_only"] is True and "/tmp" in service["tmpfs"]


def test_compose_takes_the_cpu_image_from_powertrip_image(compose):
    # `POWERTRIP_IMAGE=ghcr.io/ORG/powertrip:VERSION-cpu docker compose up` runs a published
    # image (docs/images.md); unset, the local build powertrip:dev. The CUDA workers of
    # compose.gpu.yaml keep their own image, and Prometheus and Grafana theirs.
    published = "registry.example/powertrip:0.1.0-cpu"
    for name, service in compose["services"].items():
        default = compose_interpolate(service["image"])
        chosen = compose_interpolate(service["image"], {"POWERTRIP_IMAGE": published})
        if default == f"{IMAGE}:dev":
            assert service["image"] == "${POWERTRIP_IMAGE:-powertrip:dev}", name
            assert chosen == published, name
        else:
            assert chosen == default, name


def test_compose_app_services_share_one_healthcheck(compose):
    checks = {str(svc(compose, name)["healthcheck"]["test"]) for name in APP_SERVICES}
    assert len(checks) == 1


def test_compose_healthcheck_passes_only_while_grpc_health_is_serving(compose):
    grpc = pytest.importorskip("grpc")
    health = pytest.importorskip("grpc_health.v1.health", reason="grpcio-health-checking missing")
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    test = svc(compose, "aggregator")["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("localhost:0")
    server.start()
    try:
        # The plaintext health-only port: the gRPC port demands a client certificate.
        health_port = compose_service_env(svc(compose, "aggregator"))["POWERTRIP_HEALTH_PORT"]
        code = test[3].replace(f"localhost:{health_port}", f"localhost:{port}")
        assert code != test[3], f"the healthcheck must probe the health port {health_port}"

        def healthy() -> bool:
            run = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
            return run.returncode == 0

        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert not healthy()
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert healthy()
    finally:
        server.stop(grace=None)


@pytest.mark.parametrize("name", WORKERS)
def test_compose_worker_can_shape_its_link_and_is_reachable(compose, name):
    service = svc(compose, name)
    assert "NET_ADMIN" in service["cap_add"]
    assert bind_mounts(service)["/opt/tc-scripts"] == "tc-scripts"
    # worker_id and the advertised address default to the hostname: it must resolve.
    assert service["hostname"] == name
    assert "powertrip-worker" in aliases(service)  # Prometheus discovers workers by this name


def test_compose_workers_host_disjoint_sites_covering_the_run(compose):
    num_sites = int(compose_service_env(svc(compose, "aggregator"))["POWERTRIP_NUM_SITES"])
    seen: set[int] = set()
    for name in WORKERS:
        env = compose_service_env(svc(compose, name))
        assert int(env["POWERTRIP_NUM_SITES"]) == num_sites, name
        lo, _, hi = env["POWERTRIP_SITES"].partition("-")
        sites = set(range(int(lo), int(hi or lo) + 1))
        assert not sites & seen, f"{name} hosts sites another worker hosts"
        seen |= sites
    assert seen == set(range(num_sites))


@pytest.mark.parametrize(
    ("service", "variable"),
    [("aggregator", "POWERTRIP_AGGREGATOR_ADDR"), ("profiler", "POWERTRIP_PROFILER_ADDR")],
)
def test_addresses_in_the_shared_env_resolve_in_compose_and_k8s(compose, k8s, service, variable):
    host, _, port = compose_service_env(svc(compose, "worker-eu-west"))[variable].rpartition(":")
    assert port == "50051"
    assert host in aliases(svc(compose, service))
    assert find(k8s, "Service", host)["spec"]["selector"]["app.kubernetes.io/name"] == host


def test_compose_aggregator_keeps_checkpoints_in_a_named_volume(compose):
    checkpoint_dir = compose_service_env(svc(compose, "aggregator"))["POWERTRIP_CHECKPOINT_DIR"]
    mounts = dict(reversed(v.split(":")[:2]) for v in svc(compose, "aggregator")["volumes"])
    assert mounts[checkpoint_dir] in compose["volumes"]


def test_compose_monitoring_mounts_the_single_copy_of_its_config(compose):
    rel = MONITORING.relative_to(REPO)
    assert bind_mounts(svc(compose, "prometheus")) == {
        "/etc/prometheus/prometheus.yml": f"{rel}/prometheus/prometheus.yml"
    }
    assert bind_mounts(svc(compose, "grafana")) == {
        "/etc/grafana/provisioning": f"{rel}/grafana/provisioning",
        "/etc/grafana/dashboards": str(DASHBOARDS.relative_to(REPO)),
    }
    assert "powertrip-prometheus" in aliases(svc(compose, "prometheus"))  # datasource URL host
    stray = [p for p in (REPO / "deploy").rglob("*.json") if p.parent != DASHBOARDS]
    assert not stray, "dashboards live only in deploy/k8s/components/monitoring/dashboards"


@pytest.mark.parametrize("variant", sorted(COMPOSE_VARIANTS.keys() & K8S_VARIANTS.keys()))
def test_compose_and_k8s_run_the_same_images(variant):
    built = kubectl_kustomize(K8S_VARIANTS[variant])
    if built is None:
        pytest.skip("kubectl not installed: image tags are set by kustomize")
    k8s_images = {
        c["name"]: c["image"]
        for w in built
        if w["kind"] in WORKLOAD_KINDS
        for c in w["spec"]["template"]["spec"]["containers"]
    }
    for name, service in load_compose(*COMPOSE_VARIANTS[variant])["services"].items():
        k8s_name = "worker" if name.startswith("worker-") else name
        assert compose_interpolate(service["image"]) == k8s_images[k8s_name], name
