"""The workers end with the aggregator Job in every Kubernetes variant: once the run is DONE the
aggregator scales the worker StatefulSets to 0 (POWERTRIP_STOP_WORKERS,
services/aggregator/stop_workers.py) under an account that may do that and nothing else, whose
token only the aggregator container holds."""

from __future__ import annotations

from typing import Any

from powertrip.services.aggregator.stop_workers import SERVICE_ACCOUNT
from tests.deploy.support import find, label_selector_matches, pod_spec, workloads

AGGREGATOR = "powertrip-aggregator"


def aggregator(k8s: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The aggregator Job and its one container."""
    (job,) = workloads(k8s, AGGREGATOR)
    (container,) = pod_spec(job)["containers"]
    return job, container


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["value"] for v in container.get("env", []) if "value" in v}


def token_volumes(workload: dict[str, Any]) -> list[str]:
    """The pod's volumes that carry a service account token."""
    return [
        v["name"]
        for v in pod_spec(workload).get("volumes", [])
        if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))
    ]


def test_the_aggregator_scales_exactly_the_worker_statefulsets_once_done(k8s):
    _, container = aggregator(k8s)
    env = env_of(container)
    assert env["POWERTRIP_EXIT_WHEN_DONE"] in {"1", "true"}  # the stop comes before that exit
    selector = env["POWERTRIP_STOP_WORKERS"]
    sets = [d for d in k8s if d["kind"] == "StatefulSet"]
    chosen = {
        d["metadata"]["name"]
        for d in sets
        if label_selector_matches(selector, d["metadata"].get("labels", {}))
    }
    workers = {w["metadata"]["name"] for w in workloads(k8s, "powertrip-worker")}
    assert workers and chosen == workers


def test_the_aggregators_account_may_list_statefulsets_and_scale_them_only(k8s):
    job, _ = aggregator(k8s)
    account = pod_spec(job)["serviceAccountName"]
    assert find(k8s, "ServiceAccount", account)["automountServiceAccountToken"] is False
    (binding,) = [
        b
        for b in k8s
        if b["kind"] == "RoleBinding"
        and any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"])
    ]
    assert binding["roleRef"]["kind"] == "Role"  # this namespace only
    role = find(k8s, "Role", binding["roleRef"]["name"])
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {("apps", "statefulsets", "list"), ("apps", "statefulsets/scale", "patch")}


def test_only_the_aggregator_container_holds_the_api_token(k8s):
    job, container = aggregator(k8s)
    assert pod_spec(job)["automountServiceAccountToken"] is False
    (volume,) = token_volumes(job)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts[volume]["mountPath"] == str(SERVICE_ACCOUNT)
    assert mounts[volume].get("readOnly") is True
    others = [d for d in k8s if d["kind"] in {"StatefulSet", "Deployment"}]
    assert others and not [d["metadata"]["name"] for d in others if token_volumes(d)]
