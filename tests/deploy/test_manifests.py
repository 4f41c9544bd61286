"""Every Kubernetes variant passes the static deploy checks (probes, requests and limits, a
restricted securityContext, default-deny NetworkPolicy, safe PDBs): the default one (deploy/k8s)
and every overlay in deploy/variants (curtailment, GPU workers, a dataset, plaintext, static TLS
Secrets). In static-tls the workers are one StatefulSet per worker (powertrip-worker-N), each
checked like the default's one.

No cluster needed. The checks run on ``kubectl kustomize <variant>`` when kubectl is installed,
else on a plain-Python render of the same kustomization; only the tool-specific tests skip.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import (
    BUNDLED_MONITORING,
    CUDA_IMAGE,
    IMAGE,
    K8S,
    REPO,
    WORKLOAD_KINDS,
    bundled_monitoring,
    config_map_data,
    container_env,
    dockerfile_user,
    expand_k8s_refs,
    find,
    kustomizations,
    load_yaml,
    parse_site_owners,
    parse_sites,
    pod_labels,
    pod_names,
    pod_spec,
    render_kustomize_in_python,
    selector_matches,
    service_of_command,
    tool,
    workloads,
)

K8S_VERSION = "1.32.0"  # oldest minor we support: native gRPC probes are GA since 1.27
GRPC_PORT, METRICS_PORT = 50051, 8000
HEALTH_PORT = 50052  # POWERTRIP_HEALTH_PORT: plaintext grpc.health.v1 only, for the probes
SERVICE_WORKLOADS = ("powertrip-aggregator", "powertrip-profiler", "powertrip-worker")
WORKLOADS = (*SERVICE_WORKLOADS, *BUNDLED_MONITORING)
#: Custom resources, which the offline schema set does not know; each is checked elsewhere.
CRD_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
}


@pytest.fixture(autouse=True)
def _bundled_monitoring_only_where_shipped(request):
    """Checks of the bundled Prometheus or Grafana (a workload, a flow from or to one) skip in a
    variant that replaces them with the cluster's own (deploy/variants/prometheus-operator)."""
    params = getattr(request.node, "callspec", None)
    params = params.params if params else {}
    named = {params.get("name"), *(f"powertrip-{params.get(k)}" for k in ("src", "dst"))}
    if named & set(BUNDLED_MONITORING) and not bundled_monitoring(request.getfixturevalue("k8s")):
        pytest.skip("this variant has no bundled Prometheus and Grafana")


def workload(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The one workload of pod kind ``name`` (the first worker StatefulSet in static-tls)."""
    return workloads(docs, name)[0]


def containers(w: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(w)
    return [*spec.get("initContainers", []), *spec["containers"]]


def runs_powertrip_image(container: dict[str, Any]) -> bool:
    """The repo's image, CPU or CUDA build."""
    return container["image"].split(":")[0] in {IMAGE, CUDA_IMAGE}


def effective_security(w: dict[str, Any], c: dict[str, Any], key: str) -> Any:
    """A container's securityContext setting, falling back to the pod's."""
    pod = pod_spec(w).get("securityContext", {})
    return c.get("securityContext", {}).get(key, pod.get(key))


# --------------------------------------------------------------------------------------------
# Rendering and kustomize layout


def test_kustomize_builds_the_same_objects_as_the_python_render(kustomize_build, k8s_variant):
    if kustomize_build is None:
        pytest.skip("kubectl not installed: `kubectl kustomize` not run")

    python = render_kustomize_in_python(k8s_variant)
    unhashed = {d["metadata"]["name"] for d in python if d["kind"] == "ConfigMap"}

    def key(d: dict[str, Any], hashed: bool) -> tuple[str, str]:
        name = d["metadata"]["name"]
        if hashed and d["kind"] == "ConfigMap" and name not in unhashed:  # disableNameSuffixHash
            name = re.sub(r"-[a-z0-9]{10}$", "", name)  # kustomize's content-hash suffix
        return d["kind"], name

    built = sorted(key(d, hashed=True) for d in kustomize_build)
    assert built == sorted(key(d, hashed=False) for d in python)
    # ... with the same settings: the ConfigMap merge and the patches are modelled, not skipped.
    assert config_map_data(kustomize_build) == config_map_data(python)
    for name in SERVICE_WORKLOADS:
        for ours, theirs in zip(
            workloads(python, name), workloads(kustomize_build, name), strict=True
        ):
            assert ours["kind"] == theirs["kind"], name
            assert ours["spec"].get("replicas") == theirs["spec"].get("replicas"), name
            by_name = [
                {e["name"]: e for e in containers(w)[0].get("env", [])} for w in (ours, theirs)
            ]
            assert by_name[0] == by_name[1], name  # order aside: kustomize puts patched ones first
            volumes = [{v["name"]: v for v in pod_spec(w)["volumes"]} for w in (ours, theirs)]
            assert volumes[0] == volumes[1], name


def test_variant_passes_the_kubernetes_schema(k8s):
    validator = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate not installed: no schema check"
    )
    errors = []
    # Kubernetes' own kinds only: the schema set has no CRDs. Skipped by name: cert-manager's
    # Issuer and Certificate (checked by tests/deploy/test_tls_deploys.py) and the Prometheus
    # Operator's ServiceMonitor (tests/deploy/test_k8s_prometheus_operator.py).
    for doc in (d for d in k8s if (d["apiVersion"], d["kind"]) not in CRD_KINDS):
        try:
            validator.validate(doc, K8S_VERSION, strict=True)
        except validator.ValidationError as exc:
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")
    assert not errors


def test_root_kustomization_is_the_default_variant():
    root = load_yaml(K8S / "kustomization.yaml")
    assert root["resources"] == ["base"]
    assert "components/monitoring" in root["components"]
    assert {"app.kubernetes.io/part-of": "powertrip"} in [lbl["pairs"] for lbl in root["labels"]]
    generators = {g["name"]: g for g in root["configMapGenerator"]}
    assert generators["powertrip-config"]["envs"] == ["base/powertrip.env"]
    assert "powertrip" in [img["name"] for img in root["images"]]
    for component in root["components"]:
        assert load_yaml(K8S / component / "kustomization.yaml")["kind"] == "Component"


@pytest.mark.parametrize("path", kustomizations(), ids=lambda p: str(p.relative_to(REPO)))
def test_kustomizations_use_labels_not_deprecated_common_labels(path: Path):
    assert "commonLabels" not in load_yaml(path)


def test_every_object_and_pod_is_labelled_part_of_powertrip(kustomize_build):
    if kustomize_build is None:
        pytest.skip("kubectl not installed: labels are added by kustomize")
    for doc in kustomize_build:
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "powertrip"
        if doc["kind"] in WORKLOAD_KINDS:
            assert pod_labels(doc)["app.kubernetes.io/part-of"] == "powertrip"


# --------------------------------------------------------------------------------------------
# Workloads


def test_variant_runs_exactly_the_checked_workloads(k8s):
    # A new workload must be added to WORKLOADS, which puts it under every check below.
    kinds = [pod_labels(d)["app.kubernetes.io/name"] for d in k8s if d["kind"] in WORKLOAD_KINDS]
    expected = set(WORKLOADS) - (set() if bundled_monitoring(k8s) else set(BUNDLED_MONITORING))
    assert set(kinds) == expected
    assert all(len(workloads(k8s, n)) == 1 for n in expected if n != "powertrip-worker")


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_has_readiness_and_liveness_probes(k8s, name):
    for c in (c for w in workloads(k8s, name) for c in containers(w)):
        for probe in ("readinessProbe", "livenessProbe"):
            assert probe in c, f"{name}/{c['name']} has no {probe}"
            if runs_powertrip_image(c):  # grpc.health.v1 on the health port: kubelet has no
                assert c[probe]["grpc"]["port"] == HEALTH_PORT  # client certificate for 50051


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_sets_cpu_and_memory_requests_and_limits(k8s, name):
    for c in (c for w in workloads(k8s, name) for c in containers(w)):
        for bound in ("requests", "limits"):
            assert set(c["resources"][bound]) >= {"cpu", "memory"}, f"{name}/{c['name']}"


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_runs_with_the_restricted_security_context(k8s, name):
    for w in workloads(k8s, name):
        spec = pod_spec(w)
        assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
        for c in containers(w):
            assert effective_security(w, c, "runAsNonRoot") is True
            uid = effective_security(w, c, "runAsUser")
            assert isinstance(uid, int) and uid > 0, "a numeric non-root UID lets kubelet verify it"
            assert effective_security(w, c, "seccompProfile") == {"type": "RuntimeDefault"}
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
            assert sc["readOnlyRootFilesystem"] is True
            assert not sc.get("privileged")


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_gets_a_writable_tmp_on_an_empty_dir(k8s, name):
    for w in workloads(k8s, name):
        volumes = {v["name"]: v for v in pod_spec(w).get("volumes", [])}
        for c in containers(w):
            tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            assert tmp and "emptyDir" in volumes[tmp[0]["name"]], f"{name}/{c['name']}"


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_gets_no_service_links_and_no_api_token(k8s, name):
    # Service links would inject POWERTRIP_AGGREGATOR_PORT=tcp://... and similar variables into
    # the namespace the config loader reads; no workload talks to the Kubernetes API.
    for spec in (pod_spec(w) for w in workloads(k8s, name)):
        assert spec["enableServiceLinks"] is False
        assert spec["automountServiceAccountToken"] is False


@pytest.mark.parametrize("name", SERVICE_WORKLOADS)
def test_service_pods_run_as_the_image_user(k8s, name):
    uid, gid = dockerfile_user()
    for w in workloads(k8s, name):
        for c in containers(w):
            assert runs_powertrip_image(c)
            assert effective_security(w, c, "runAsUser") == uid
            assert effective_security(w, c, "runAsGroup") == gid


@pytest.mark.parametrize("name", SERVICE_WORKLOADS)
def test_service_pods_expose_grpc_and_metrics_and_ask_to_be_scraped(k8s, name):
    for w in workloads(k8s, name):
        annotations = w["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(METRICS_PORT)
        (c,) = containers(w)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports == {"grpc": GRPC_PORT, "metrics": METRICS_PORT, "health": HEALTH_PORT}


# --------------------------------------------------------------------------------------------
# Services, config, storage, scaling


def test_every_service_selects_a_workload_and_its_named_ports(k8s):
    for svc in (d for d in k8s if d["kind"] == "Service"):
        pods = [
            w
            for w in k8s
            if w["kind"] in WORKLOAD_KINDS
            and selector_matches({"matchLabels": svc["spec"]["selector"]}, pod_labels(w))
        ]
        kinds = {pod_labels(w)["app.kubernetes.io/name"] for w in pods}
        assert len(kinds) == 1, f"Service {svc['metadata']['name']} selects {len(pods)} workloads"
        ports = {p.get("name") for c in containers(pods[0]) for p in c.get("ports", [])}
        ports |= {p["containerPort"] for c in containers(pods[0]) for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port.get("targetPort", port["port"]) in ports


def test_worker_service_is_headless_and_publishes_registering_pods(k8s):
    (service_name,) = {sts["spec"]["serviceName"] for sts in workloads(k8s, "powertrip-worker")}
    svc = find(k8s, "Service", service_name)
    assert svc["spec"]["clusterIP"] == "None"  # one DNS record per pod
    # The aggregator and profiler dial a worker's advertised name before the worker is ready.
    assert svc["spec"]["publishNotReadyAddresses"] is True


def test_every_config_map_reference_resolves(k8s):
    config_maps = {d["metadata"]["name"] for d in k8s if d["kind"] == "ConfigMap"}
    for w in (d for d in k8s if d["kind"] in WORKLOAD_KINDS):
        refs = [v["configMap"]["name"] for v in pod_spec(w).get("volumes", []) if "configMap" in v]
        refs += [
            e["configMapRef"]["name"]
            for c in containers(w)
            for e in c.get("envFrom", [])
            if "configMapRef" in e
        ]
        assert set(refs) <= config_maps, w["metadata"]["name"]


@pytest.mark.parametrize("name", WORKLOADS)
def test_env_references_name_variables_defined_before_them(k8s, name):
    # Kubernetes expands $(VAR) only from variables listed earlier; a later one stays literal
    # (a patch that reorders env can break POWERTRIP_ADVERTISE_HOST=$(POD_NAME)...).
    for c in (c for w in workloads(k8s, name) for c in containers(w)):
        defined: set[str] = set()
        for var in c.get("env", []):
            refs = set(re.findall(r"\$\((\w+)\)", var.get("value", "")))
            assert refs <= defined, f"{name}/{c['name']}: {var['name']} uses {refs - defined}"
            defined.add(var["name"])


def test_aggregator_checkpoints_on_a_persistent_volume(k8s):
    w = workload(k8s, "powertrip-aggregator")
    checkpoint_dir = config_map_data(k8s)["POWERTRIP_CHECKPOINT_DIR"]
    (c,) = containers(w)
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == checkpoint_dir]
    volumes = {v["name"]: v for v in pod_spec(w)["volumes"]}
    claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
    assert find(k8s, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteOnce"]
    # One writer: one pod at a time, and a replacement only once the old one is gone (a Job's
    # default replaces a pod while it is still terminating).
    assert w["kind"] == "Job"
    assert w["spec"]["parallelism"] == w["spec"]["completions"] == 1
    assert w["spec"]["podReplacementPolicy"] == "Failed"


@pytest.mark.parametrize("name", SERVICE_WORKLOADS)
def test_each_service_workload_runs_its_console_script_from_the_wheel(k8s, name):
    """Console scripts, not ``python -m``: they import the installed package whatever the
    container's working directory holds."""
    (c,) = containers(workload(k8s, name))  # the per-worker copies share the command
    assert service_of_command([*c["command"], *c.get("args", [])]) == name.split("-")[1]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert name in scripts


def worker_pod_env(
    sts: dict[str, Any], config: dict[str, str], pod_name: str, tmp_path: Path
) -> dict[str, str]:
    """Run the worker container's command for pod ``pod_name`` with a stand-in
    ``powertrip-worker`` that prints the environment the real worker would start with."""
    (c,) = containers(sts)
    env = container_env(sts, pod_name, config)  # config: what envFrom powertrip-config provides
    fake = tmp_path / "bin" / "powertrip-worker"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\nenv\n")
    fake.chmod(0o755)
    argv = [expand_k8s_refs(a, env) for a in [*c["command"], *c.get("args", [])]]
    out = subprocess.run(
        argv,
        env={**env, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def worker_sites(k8s: list[dict[str, Any]], tmp_path: Path) -> dict[str, set[int]]:
    """Worker id -> the sites its pod claims, for every worker pod of the variant."""
    config = config_map_data(k8s)
    claimed: dict[str, set[int]] = {}
    for sts in workloads(k8s, "powertrip-worker"):
        for pod in pod_names(sts):
            env = worker_pod_env(sts, config, pod, tmp_path)
            # The address the worker registers must be its per-pod DNS name.
            assert env["POWERTRIP_ADVERTISE_HOST"] == f"{pod}.{sts['spec']['serviceName']}"
            assert env["POWERTRIP_WORKER_ID"] not in claimed, "two pods share a worker id"
            claimed[env["POWERTRIP_WORKER_ID"]] = parse_sites(env["POWERTRIP_SITES"])
    return claimed


@pytest.mark.skipif(tool("sh") is None, reason="no POSIX sh to run the worker command")
def test_worker_pods_host_disjoint_sites_covering_the_run(k8s, tmp_path):
    num_sites = int(config_map_data(k8s)["POWERTRIP_NUM_SITES"])
    seen: set[int] = set()
    for worker, sites in worker_sites(k8s, tmp_path).items():
        assert sites and not sites & seen, f"{worker} hosts {sorted(sites)}"
        seen |= sites
    assert seen == set(range(num_sites)), "replicas x SITES_PER_WORKER must equal NUM_SITES"


@pytest.mark.reliability("R28")
@pytest.mark.skipif(tool("sh") is None, reason="no POSIX sh to run the worker command")
def test_aggregator_site_owners_are_exactly_the_sites_each_worker_pod_claims(k8s, tmp_path):
    # The aggregator refuses a claim outside the owners map (and a worker it does not name), so
    # a map that drifts from the pods' sites (scaled workers, another SITES_PER_WORKER) would
    # keep the run from ever starting.
    (aggregator,) = workloads(k8s, "powertrip-aggregator")
    env = container_env(aggregator, "powertrip-aggregator-0")
    assert parse_site_owners(env["POWERTRIP_SITE_OWNERS"]) == worker_sites(k8s, tmp_path)


def test_pod_disruption_budgets_never_block_every_eviction(k8s):
    pdbs = [d for d in k8s if d["kind"] == "PodDisruptionBudget"]
    for sts in workloads(k8s, "powertrip-worker"):
        assert any(selector_matches(p["spec"]["selector"], pod_labels(sts)) for p in pdbs)
    for pdb in pdbs:
        spec = pdb["spec"]
        assert str(spec.get("maxUnavailable", "1")) not in {"0", "0%"}, pdb["metadata"]["name"]
        targets = [
            w
            for w in k8s
            if w["kind"] in WORKLOAD_KINDS and selector_matches(spec["selector"], pod_labels(w))
        ]
        if "minAvailable" in spec:
            assert str(spec["minAvailable"]) != "100%"
            assert all(spec["minAvailable"] < w["spec"]["replicas"] for w in targets)


# --------------------------------------------------------------------------------------------
# Namespace and network policy


def test_namespace_enforces_the_restricted_pod_security_standard(k8s):
    (ns,) = [d for d in k8s if d["kind"] == "Namespace"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_a_default_deny_policy_covers_every_pod(k8s):
    deny = [
        p
        for p in k8s
        if p["kind"] == "NetworkPolicy"
        and p["spec"]["podSelector"] == {}
        and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    assert deny, "no NetworkPolicy denies all ingress and egress by default"


def flow_allowed(docs: list[dict[str, Any]], src: str, dst: str, port: int) -> bool:
    """Would NetworkPolicy let pod ``src`` open a TCP connection to pod ``dst`` on ``port``?
    Models same-namespace podSelector peers and numeric ports, which is all we use."""
    src_labels = pod_labels(workload(docs, f"powertrip-{src}"))
    dst_labels = pod_labels(workload(docs, f"powertrip-{dst}"))
    policies = [d["spec"] for d in docs if d["kind"] == "NetworkPolicy"]

    def rule_allows(rule: dict[str, Any], peers_key: str, peer: dict[str, str]) -> bool:
        peers = rule.get(peers_key, [])
        peer_ok = not peers or any(
            "namespaceSelector" not in q and selector_matches(q.get("podSelector", {}), peer)
            for q in peers
        )
        ports = rule.get("ports", [])
        return peer_ok and (not ports or any(p.get("port") == port for p in ports))

    def allows(direction: str, pod: dict[str, str], peer: dict[str, str]) -> bool:
        field, peers_key = direction.lower(), "from" if direction == "Ingress" else "to"
        selecting = [
            p
            for p in policies
            if selector_matches(p["podSelector"], pod)
            and direction
            in (p.get("policyTypes") or ["Ingress", *(["Egress"] if "egress" in p else [])])
        ]
        if not selecting:
            return True  # the pod is not isolated in this direction
        return any(rule_allows(r, peers_key, peer) for p in selecting for r in p.get(field, []))

    return allows("Egress", src_labels, dst_labels) and allows("Ingress", dst_labels, src_labels)


ALLOWED_FLOWS = [
    ("worker", "aggregator", GRPC_PORT),  # RegisterWorker, SubmitUpdate
    ("aggregator", "worker", GRPC_PORT),  # StartRound
    ("aggregator", "profiler", GRPC_PORT),  # site profiles
    ("profiler", "worker", GRPC_PORT),  # link probes
    ("prometheus", "aggregator", METRICS_PORT),
    ("prometheus", "profiler", METRICS_PORT),
    ("prometheus", "worker", METRICS_PORT),
    ("grafana", "prometheus", 9090),
]
DENIED_FLOWS = [
    ("worker", "worker", GRPC_PORT),
    ("worker", "profiler", GRPC_PORT),
    ("profiler", "aggregator", GRPC_PORT),
    ("worker", "aggregator", METRICS_PORT),
    ("prometheus", "aggregator", GRPC_PORT),
    ("grafana", "aggregator", METRICS_PORT),
    ("aggregator", "grafana", 3000),
    # The plaintext health port is for kubelet (from the node) only, never from a pod.
    ("worker", "aggregator", HEALTH_PORT),
    ("aggregator", "worker", HEALTH_PORT),
    ("prometheus", "profiler", HEALTH_PORT),
]


@pytest.mark.parametrize(("src", "dst", "port"), ALLOWED_FLOWS)
def test_network_policy_allows_the_rpc_and_scrape_paths(k8s, src, dst, port):
    assert flow_allowed(k8s, src, dst, port)


@pytest.mark.parametrize(("src", "dst", "port"), DENIED_FLOWS)
def test_network_policy_denies_everything_else(k8s, src, dst, port):
    assert not flow_allowed(k8s, src, dst, port)


def test_every_pod_may_resolve_dns(k8s):
    dns = [
        p["spec"]
        for p in k8s
        if p["kind"] == "NetworkPolicy" and p["spec"]["podSelector"] == {}
        for rule in p["spec"].get("egress", [])
        if {"protocol": "UDP", "port": 53} in rule.get("ports", [])
    ]
    assert dns, "default-deny egress without a DNS allowance breaks every Service name"
