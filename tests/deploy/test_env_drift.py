"""Every POWERTRIP_* variable a deployment sets is one the services read, and each service gets
the ones it requires. A renamed config field fails here instead of being silently ignored
(``load_config`` skips unknown POWERTRIP_* names, since the env file is shared)."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest

from tests.deploy.support import (
    COMPOSE,
    CURTAILMENT_ENV,
    DATASET_ENV,
    DOCKERFILE,
    ENV_PREFIX,
    SERVICES,
    SHARED_ENV,
    all_env_vars,
    compose_env_files,
    compose_service_env,
    env_vars,
    find,
    load_yaml,
    pod_spec,
    read_env_file,
    service_of_command,
    with_tls_stand_ins,
    workloads,
)

COMPOSE_SERVICES = {
    name: service_of_command(s.get("command"))
    for name, s in load_yaml(COMPOSE)["services"].items()
    if service_of_command(s.get("command"))
}
K8S_WORKLOADS = {f"powertrip-{s}": s for s in SERVICES}


def powertrip_names(names: Any) -> set[str]:
    return {n for n in names if n.startswith(ENV_PREFIX)}


def required(service: str) -> set[str]:
    return {name for name, req in env_vars(service).items() if req}


def known(service: str) -> set[str]:
    return set(env_vars(service))


def test_the_field_parser_sees_the_service_config():
    # Guards the checks below against passing vacuously on an empty parse.
    assert {"POWERTRIP_GRPC_PORT", "POWERTRIP_METRICS_PORT"} <= known("profiler")
    assert {"POWERTRIP_PROFILER_ADDR"} <= required("aggregator")
    assert {"POWERTRIP_AGGREGATOR_ADDR", "POWERTRIP_SITES"} <= required("worker")
    assert "POWERTRIP_SITES" not in known("aggregator")
    # Fields inherited from settings mixins (CurtailSettings), not only those declared in place.
    for service in ("aggregator", "profiler"):
        assert {"POWERTRIP_CURTAIL_PRESET", "POWERTRIP_SITE_REGIONS"} <= known(service)
    assert "POWERTRIP_CURTAIL_PRESET" not in known("worker")
    assert {"POWERTRIP_MODE", "POWERTRIP_CURTAIL_POLICY"} <= known("aggregator")
    assert "POWERTRIP_NOT_A_FIELD" not in all_env_vars()


@pytest.mark.parametrize("path", [SHARED_ENV, CURTAILMENT_ENV, DATASET_ENV], ids=lambda p: p.name)
def test_env_file_sets_only_variables_some_service_reads(path):
    env = powertrip_names(read_env_file(path))
    assert env and env - all_env_vars() == set()


def test_image_env_sets_only_variables_some_service_reads():
    image_env = set(re.findall(r"\b(POWERTRIP_[A-Z0-9_]+)=", DOCKERFILE.read_text()))
    assert image_env - all_env_vars() == set()


# --------------------------------------------------------------------------------------------
# compose


def compose_env(compose: dict[str, Any], name: str) -> tuple[set[str], set[str]]:
    """(variables from the env files, variables set for this service alone)."""
    service = compose["services"][name]
    shared = set().union(*(read_env_file(f) for f in compose_env_files(service)))
    return powertrip_names(shared), powertrip_names(service.get("environment") or {})


@pytest.mark.parametrize("name", sorted(COMPOSE_SERVICES))
def test_compose_env_files_set_only_variables_some_service_reads(compose, name):
    shared, _ = compose_env(compose, name)
    assert shared - all_env_vars() == set()


@pytest.mark.parametrize("name", sorted(COMPOSE_SERVICES))
def test_compose_service_sets_only_its_own_config_fields(compose, name):
    _, own = compose_env(compose, name)
    assert own - known(COMPOSE_SERVICES[name]) == set()


@pytest.mark.parametrize("name", sorted(COMPOSE_SERVICES))
def test_compose_service_gets_every_required_variable(compose, name):
    shared, own = compose_env(compose, name)
    assert required(COMPOSE_SERVICES[name]) - (shared | own) == set()


def test_compose_runs_every_service(compose):
    commands = (service_of_command(s.get("command")) for s in compose["services"].values())
    assert {c for c in commands if c} == set(SERVICES)


def service_config_classes() -> dict[str, Any]:
    try:
        return {
            "aggregator": importlib.import_module(
                "powertrip.services.aggregator.config"
            ).AggregatorConfig,
            "profiler": importlib.import_module(
                "powertrip.services.profiler.config"
            ).ProfilerConfig,
            "worker": importlib.import_module("powertrip.services.worker.config").WorkerConfig,
        }
    except (ImportError, AttributeError) as exc:
        pytest.skip(f"service config modules not importable from this checkout: {exc}")


def load_service_config(service: str, env: dict[str, str]) -> Any:
    """The service's config as its real loader builds it; raises ConfigError naming the bad
    variable (values, not just names: e.g. curtailment mode on the wall clock)."""
    load_config = importlib.import_module("powertrip.services.common.config").load_config
    return load_config(service_config_classes()[service], with_tls_stand_ins(env))


def test_compose_env_is_valid_config_for_every_service(compose):
    service_config_classes()
    for name, service in COMPOSE_SERVICES.items():
        load_service_config(service, compose_service_env(compose["services"][name]))


# --------------------------------------------------------------------------------------------
# k8s


def k8s_env(k8s: list[dict[str, Any]], name: str) -> tuple[set[str], set[str]]:
    """(variables from ConfigMaps via envFrom, variables set on the container or by its
    command, e.g. the worker's ``export POWERTRIP_SITES=...``), for the pods ``name`` (the
    first worker StatefulSet of static-tls: the others differ only in their Secret)."""
    w = workloads(k8s, name)[0]
    (c,) = pod_spec(w)["containers"]
    from_maps: set[str] = set()
    for ref in c.get("envFrom", []):
        from_maps |= set(find(k8s, "ConfigMap", ref["configMapRef"]["name"])["data"])
    own = {e["name"] for e in c.get("env", [])}
    command = " ".join([*c.get("command", []), *c.get("args", [])])
    own |= set(re.findall(r"\bexport\s+(POWERTRIP_[A-Z0-9_]+)=", command))
    return powertrip_names(from_maps), powertrip_names(own)


@pytest.mark.parametrize("name", sorted(K8S_WORKLOADS))
def test_k8s_workload_sets_only_config_fields(k8s, name):
    shared, own = k8s_env(k8s, name)
    assert shared - all_env_vars() == set()
    assert own - known(K8S_WORKLOADS[name]) == set()


@pytest.mark.parametrize("name", sorted(K8S_WORKLOADS))
def test_k8s_workload_gets_every_required_variable(k8s, name):
    shared, own = k8s_env(k8s, name)
    assert required(K8S_WORKLOADS[name]) - (shared | own) == set()


@pytest.mark.parametrize("name", ["powertrip-aggregator", "powertrip-profiler"])
def test_k8s_config_is_valid_config_for_the_service(k8s, name):
    (w,) = workloads(k8s, name)
    (c,) = pod_spec(w)["containers"]
    env = {
        k: v
        for ref in c["envFrom"]
        for k, v in find(k8s, "ConfigMap", ref["configMapRef"]["name"])["data"].items()
    }
    env |= {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    load_service_config(K8S_WORKLOADS[name], env)
