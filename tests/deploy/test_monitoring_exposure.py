"""Nothing unauthenticated is reachable beyond the machine or the cluster (reliability matrix
R25: deploy-config drift): compose publishes ports on 127.0.0.1 only, bar the aggregator's
mutual-TLS gRPC port (workers on other machines may need it); Grafana has no anonymous access
and takes its admin password from a secret, in compose and in k8s; no monitoring Service is a
NodePort or LoadBalancer."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.support import (
    MONITORING,
    REPO,
    bundled_monitoring,
    pod_spec,
    read_env_file,
    workloads,
)

GRAFANA_ENV = MONITORING / "grafana" / "grafana.env"
#: the only (service, container port) compose may publish on every interface
PUBLIC = {("aggregator", 50051)}


def published(service: dict[str, Any]) -> list[tuple[str | None, int]]:
    """(host address or None for every interface, container port) of each published port."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.append((port.get("host_ip"), int(port["target"])))
            continue
        parts = str(port).split("/")[0].split(":")
        host_ip = parts[0] if len(parts) == 3 else None
        out.append((host_ip, int(parts[-1])))
    return out


@pytest.mark.reliability("R25")
def test_compose_publishes_ports_on_localhost_only_but_the_aggregators_grpc(compose):
    ports = {n: published(s) for n, s in compose["services"].items()}
    assert ports["prometheus"] and ports["grafana"]  # the monitoring UIs, for this machine
    for name, entries in ports.items():
        for host_ip, target in entries:
            assert host_ip == "127.0.0.1" or (name, target) in PUBLIC, f"{name}: {target}"


@pytest.mark.reliability("R25")
def test_grafana_has_no_anonymous_access_and_reads_its_password_from_a_file():
    env = read_env_file(GRAFANA_ENV)
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert "GF_AUTH_ANONYMOUS_ORG_ROLE" not in env
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env  # never a literal password
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"].startswith("/run/secrets/")


@pytest.mark.reliability("R25")
def test_compose_grafana_password_is_a_git_ignored_file_secret(compose):
    grafana = compose["services"]["grafana"]
    path = read_env_file(GRAFANA_ENV)["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    (secret,) = [s for s in grafana["secrets"] if f"/run/secrets/{s['target']}" == path]
    host_file = compose["secrets"][secret["source"]]["file"]
    assert host_file.startswith("./secrets/")
    assert "/secrets/" in (REPO / ".gitignore").read_text().split()


@pytest.mark.reliability("R25")
def test_k8s_grafana_password_comes_from_a_secret_and_no_service_leaves_the_cluster(k8s):
    for svc in (d for d in k8s if d["kind"] == "Service"):
        assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]
    if not bundled_monitoring(k8s):
        pytest.skip("no bundled Grafana in this variant (the cluster's own serves the dashboards)")
    (grafana,) = workloads(k8s, "powertrip-grafana")
    path = read_env_file(GRAFANA_ENV)["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    (c,) = pod_spec(grafana)["containers"]
    (mount,) = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod_spec(grafana)["volumes"] if v["name"] == mount["name"]]
    assert mount["readOnly"] is True and volume["secret"]["secretName"]
    assert path.endswith("/" + volume["secret"]["items"][0]["path"])
