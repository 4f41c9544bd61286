"""The deploys against what the services do by default (reliability matrix R38): /metrics binds
127.0.0.1 unless configured, so every deploy that scrapes it sets an address on the pod or
container network; and the orchestrator's SIGKILL comes after the grace period each service
announces for its SIGTERM exit, never before."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import pytest

from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.grpc_server import DEFAULT_GRACE_S
from tests.deploy.support import (
    SERVICES,
    compose_service_env,
    find,
    pod_spec,
    service_of_command,
    workloads,
)

#: Kubernetes' terminationGracePeriodSeconds and compose's stop_grace_period when unset
K8S_DEFAULT_KILL_S = 30.0
COMPOSE_DEFAULT_KILL_S = 10.0


def metrics_addr(env: dict[str, str]) -> str:
    return env.get("POWERTRIP_METRICS_ADDR", ServiceConfig.model_fields["metrics_addr"].default)


def metrics_port(env: dict[str, str]) -> int:
    return int(
        env.get("POWERTRIP_METRICS_PORT", ServiceConfig.model_fields["metrics_port"].default)
    )


def announced_grace_s(service: str, env: dict[str, str]) -> float:
    """What the service logs at SIGTERM: 'exit within N s'."""
    if service == "aggregator":
        default = AggregatorConfig.model_fields["shutdown_grace_s"].default
        return float(env.get("POWERTRIP_SHUTDOWN_GRACE_S", default))
    return DEFAULT_GRACE_S


def reachable_from_the_network(addr: str) -> bool:
    return not ipaddress.ip_address(addr).is_loopback


def test_the_services_default_is_loopback_so_the_deploys_must_say_otherwise():
    assert not reachable_from_the_network(metrics_addr({}))


def duration_s(text: str) -> float:
    """A compose duration ('15s', '1m30s', '500ms')."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def compose_services(compose: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    out = {}
    for name, svc in compose["services"].items():
        if kind := service_of_command(svc.get("command")):
            out[name] = (kind, svc)
    assert {kind for kind, _ in out.values()} == set(SERVICES)
    return out


@pytest.mark.reliability("R38")
def test_compose_services_serve_metrics_on_the_container_network(compose):
    for name, (_, svc) in compose_services(compose).items():
        env = compose_service_env(svc)
        assert reachable_from_the_network(metrics_addr(env)), name
        assert metrics_port(env) == 8000, name  # what deploy/.../prometheus.yml scrapes


@pytest.mark.reliability("R38")
def test_compose_kills_only_after_the_announced_grace(compose):
    for name, (kind, svc) in compose_services(compose).items():
        kill_s = duration_s(svc["stop_grace_period"]) if "stop_grace_period" in svc else None
        kill_s = COMPOSE_DEFAULT_KILL_S if kill_s is None else kill_s
        assert kill_s > announced_grace_s(kind, compose_service_env(svc)), name


def pod_env(k8s: list[dict[str, Any]], w: dict[str, Any]) -> dict[str, str]:
    """The container's literal variables: its ConfigMaps (envFrom), then its own env."""
    (c,) = pod_spec(w)["containers"]
    env: dict[str, str] = {}
    for ref in c.get("envFrom", []):
        env |= find(k8s, "ConfigMap", ref["configMapRef"]["name"])["data"]
    env |= {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    return env


@pytest.mark.reliability("R38")
@pytest.mark.parametrize("service", SERVICES)
def test_k8s_pods_serve_metrics_on_the_pod_network_where_prometheus_looks(k8s, service):
    for w in workloads(k8s, f"powertrip-{service}"):
        env = pod_env(k8s, w)
        assert reachable_from_the_network(metrics_addr(env)), w["metadata"]["name"]
        (c,) = pod_spec(w)["containers"]
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        assert ports["metrics"] == metrics_port(env)
        annotations = w["spec"]["template"]["metadata"].get("annotations", {})
        if "prometheus.io/port" in annotations:
            assert int(annotations["prometheus.io/port"]) == metrics_port(env)


@pytest.mark.reliability("R38")
@pytest.mark.parametrize("service", SERVICES)
def test_k8s_kills_only_after_the_announced_grace(k8s, service):
    for w in workloads(k8s, f"powertrip-{service}"):
        kill_s = pod_spec(w).get("terminationGracePeriodSeconds", K8S_DEFAULT_KILL_S)
        assert kill_s > announced_grace_s(service, pod_env(k8s, w)), w["metadata"]["name"]
