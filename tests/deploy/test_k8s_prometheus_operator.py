"""deploy/variants/prometheus-operator: the cluster's Prometheus Operator and Grafana
(kube-prometheus-stack) monitor the run instead of the bundled ones.

The offline schema set has no CRDs, so the ServiceMonitor is checked here by its structure and
against the rendered Services it must select; the rest of the variant goes through every check
of test_manifests.py (it is one of K8S_VARIANTS).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.support import (
    DASHBOARDS,
    K8S,
    PROMETHEUS_OPERATOR_VARIANT,
    find,
    kubectl_kustomize,
    load_yaml,
    pod_labels,
    render_kustomize_in_python,
    selector_matches,
    workloads,
)

SERVICES = ("powertrip-aggregator", "powertrip-profiler", "powertrip-worker")
METRICS_PORT = 8000
SIDECAR_LABEL = {"grafana_dashboard": "1"}  # kube-prometheus-stack's Grafana sidecar default
SELECTOR_KEYS = {"matchLabels", "matchExpressions"}
ENDPOINT_KEYS = {"port", "path", "interval", "scrapeTimeout", "scheme", "relabelings"}


def render(root=PROMETHEUS_OPERATOR_VARIANT) -> list[dict[str, Any]]:
    built = kubectl_kustomize(root)
    return list(built) if built is not None else render_kustomize_in_python(root)


def service_monitors(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "ServiceMonitor"]


def selected_services(docs: list[dict[str, Any]], monitor: dict[str, Any]) -> list[dict]:
    return [
        d
        for d in docs
        if d["kind"] == "Service"
        and selector_matches(monitor["spec"]["selector"], d["metadata"].get("labels", {}))
    ]


def test_a_service_monitor_renders_with_the_operators_structure():
    (monitor,) = service_monitors(render())
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["name"]
    spec = monitor["spec"]
    assert set(spec["selector"]) <= SELECTOR_KEYS and spec["selector"]
    for expr in spec["selector"].get("matchExpressions", []):
        assert expr["operator"] in {"In", "NotIn", "Exists", "DoesNotExist"}
    assert spec["endpoints"]
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= ENDPOINT_KEYS
        assert isinstance(endpoint["port"], str), "the Service port's name, not its number"
    # kube-prometheus-stack's Prometheus picks ServiceMonitors by the Helm release label.
    assert monitor["metadata"]["labels"]["release"]


def test_the_service_monitor_selects_exactly_the_services_and_their_metrics_ports():
    docs = render()
    (monitor,) = service_monitors(docs)
    services = selected_services(docs, monitor)
    assert sorted(s["metadata"]["name"] for s in services) == sorted(SERVICES)
    # Same namespace: no namespaceSelector needed, or one that names it.
    namespaces = {s["metadata"].get("namespace") for s in services}
    assert namespaces == {monitor["metadata"].get("namespace")}
    names = monitor["spec"].get("namespaceSelector", {}).get("matchNames")
    assert names is None or namespaces <= set(names)
    for svc in services:
        ports = {p["name"]: p for p in svc["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in ports, svc["metadata"]["name"]
            assert ports[endpoint["port"]]["port"] == METRICS_PORT


def test_the_monitored_services_reach_pods_that_serve_metrics():
    docs = render()
    (monitor,) = service_monitors(docs)
    for svc in selected_services(docs, monitor):
        (w, *_) = workloads(docs, svc["spec"]["selector"]["app.kubernetes.io/name"])
        assert selector_matches({"matchLabels": svc["spec"]["selector"]}, pod_labels(w))
        (c,) = w["spec"]["template"]["spec"]["containers"]
        assert {"name": "metrics", "containerPort": METRICS_PORT} in c["ports"]


def test_the_operators_prometheus_may_scrape_every_service_pod_from_its_namespace():
    docs = render()
    policies = [d["spec"] for d in docs if d["kind"] == "NetworkPolicy"]
    for name in SERVICES:
        for w in workloads(docs, name):
            allowed = [
                peer
                for p in policies
                if selector_matches(p["podSelector"], pod_labels(w))
                for rule in p.get("ingress", [])
                if {"port": METRICS_PORT} in rule.get("ports", [])
                for peer in rule.get("from", [])
                if "namespaceSelector" in peer and peer["namespaceSelector"]
            ]
            assert allowed, f"{name}: no ingress to :{METRICS_PORT} from another namespace"


def test_the_bundled_prometheus_and_grafana_are_gone():
    docs = render()
    assert not [d for d in docs if d["metadata"].get("labels", {}).get("powertrip.io/monitoring")]
    names = {d["metadata"]["name"] for d in docs}
    assert not names & {"powertrip-prometheus", "powertrip-grafana"}


@pytest.mark.parametrize("root", [K8S, PROMETHEUS_OPERATOR_VARIANT], ids=["default", "operator"])
def test_the_dashboards_config_map_is_labelled_for_the_grafana_sidecar(root):
    cm = find(render(root), "ConfigMap", "powertrip-grafana-dashboards")
    # A fixed name: a hashed one would leave old labelled copies for the sidecar to load.
    assert cm["metadata"]["name"] == "powertrip-grafana-dashboards"
    assert SIDECAR_LABEL.items() <= cm["metadata"]["labels"].items()
    files = {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}
    assert cm["data"] == files


def test_the_component_is_opt_in_from_its_own_overlay():
    root = load_yaml(K8S / "kustomization.yaml")
    assert "components/prometheus-operator" not in root["components"]
    overlay = load_yaml(PROMETHEUS_OPERATOR_VARIANT / "kustomization.yaml")
    assert overlay["resources"] == ["../../k8s"]
    assert overlay["components"] == ["../../k8s/components/prometheus-operator"]
