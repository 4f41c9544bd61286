"""The aggregator is a Job in every Kubernetes variant: a run ends, and `kubectl wait
--for=condition=complete job/powertrip-aggregator` has something to wait on.

The Job completes when its one pod exits 0, which the aggregator does once the run is DONE only
with POWERTRIP_EXIT_WHEN_DONE set; its other exit codes (read from the service's source) decide
whether a new pod is worth starting.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from tests.deploy.support import (
    REPO,
    SERVICES_SRC,
    container_env,
    env_vars,
    pod_labels,
    pod_spec,
    selector_matches,
    workloads,
)

AGGREGATOR = "powertrip-aggregator"
MAIN = SERVICES_SRC / "aggregator" / "__main__.py"


def aggregator_job(k8s: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = workloads(k8s, AGGREGATOR)
    return job


def main_exit_codes() -> set[int]:
    """The integer codes ``main()`` of the aggregator returns, constants resolved."""
    tree = ast.parse(MAIN.read_text(), str(MAIN))
    constants = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, int)
    }
    (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    codes: set[int] = set()
    for node in ast.walk(main):
        if isinstance(node, ast.Return) and node.value is not None:
            for leaf in ast.walk(node.value):
                if isinstance(leaf, ast.Constant) and isinstance(leaf.value, int):
                    codes.add(leaf.value)
                elif isinstance(leaf, ast.Name) and leaf.id in constants:
                    codes.add(constants[leaf.id])
    return codes


def test_the_aggregator_is_a_job_of_one_pod(k8s):
    job = aggregator_job(k8s)
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    spec = job["spec"]
    assert spec.get("completions", 1) == 1 and spec.get("parallelism", 1) == 1
    assert "selector" not in spec and not spec.get("manualSelector"), "the Job's own selector"
    assert "ttlSecondsAfterFinished" not in spec, "a deleted Job cannot be waited on"


def test_the_aggregator_exits_when_its_run_is_done_so_the_job_completes(k8s):
    assert "POWERTRIP_EXIT_WHEN_DONE" in env_vars("aggregator")
    env = container_env(aggregator_job(k8s), f"{AGGREGATOR}-0")
    assert env["POWERTRIP_EXIT_WHEN_DONE"] in {"1", "true"}


def test_the_job_retries_a_failed_run_a_few_times_but_not_a_hopeless_start(k8s):
    job = aggregator_job(k8s)
    spec = job["spec"]
    assert pod_spec(job)["restartPolicy"] in {"Never", "OnFailure"}
    assert 1 <= spec["backoffLimit"] <= 6
    codes = main_exit_codes()
    assert {0, 2, 3, 4} <= codes, codes  # done, configuration, no checkpoint, run FAILED
    rules = spec["podFailurePolicy"]["rules"]
    fail_job = {
        code
        for r in rules
        if r["action"] == "FailJob" and r["onExitCodes"]["operator"] == "In"
        for code in r["onExitCodes"]["values"]
    }
    (container,) = pod_spec(job)["containers"]
    assert all(
        r["onExitCodes"]["containerName"] == container["name"] for r in rules if "onExitCodes" in r
    )
    # 2 and 3 would fail again in a new pod; 4 (a failed run) resumes from a checkpoint.
    assert fail_job == {2, 3}
    ignored = [c for r in rules if r["action"] == "Ignore" for c in r.get("onPodConditions", [])]
    assert {"type": "DisruptionTarget", "status": "True"} in ignored, "a drain is no failure"
    # Never a second pod beside one still terminating: they would share the checkpoint volume.
    assert spec["podReplacementPolicy"] == "Failed"


def test_the_service_and_network_policies_still_select_the_jobs_pods(k8s):
    labels = pod_labels(aggregator_job(k8s))
    svc = [d for d in k8s if d["kind"] == "Service" and d["metadata"]["name"] == AGGREGATOR]
    assert svc and selector_matches({"matchLabels": svc[0]["spec"]["selector"]}, labels)
    policies = [
        p["metadata"]["name"]
        for p in k8s
        if p["kind"] == "NetworkPolicy" and p["spec"]["podSelector"]
        if selector_matches(p["spec"]["podSelector"], labels)
    ]
    assert AGGREGATOR in policies


def test_no_disruption_budget_holds_the_aggregator_against_a_drain(k8s):
    labels = pod_labels(aggregator_job(k8s))
    pdbs = [d for d in k8s if d["kind"] == "PodDisruptionBudget"]
    assert not [p for p in pdbs if selector_matches(p["spec"]["selector"], labels)]


def test_the_readme_waits_on_the_rendered_job():
    readme = (REPO / "deploy" / "README.md").read_text()
    command = r"kubectl -n (\S+) wait --for=condition=complete job/(\S+) --timeout=\S+"
    wait = re.search(command, readme)
    assert wait, "deploy/README.md shows no `kubectl wait` on the Job"
    assert wait.groups() == ("powertrip", AGGREGATOR)
