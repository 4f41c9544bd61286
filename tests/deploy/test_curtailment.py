"""The opt-in curtailment mode (docs/curtailment.md) deploys as the services expect it: the k8s
component (deploy/k8s/components/curtailment, applied by deploy/variants/curtailment) and the
compose override (compose.curtailment.yaml) switch the aggregator to POWERTRIP_MODE=curtailment with
the same settings, the profiler serves exactly the sites the run has, and the default variants are
unchanged. Hardening, names, required variables: the variant-parametrized tests in test_manifests,
test_compose and test_env_drift."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from tests.deploy.support import (
    COMPOSE_CURTAILMENT,
    COMPOSE_VARIANTS,
    CURTAILMENT_COMPONENT,
    CURTAILMENT_ENV,
    CURTAILMENT_VARIANT,
    K8S,
    K8S_VARIANTS,
    REPO,
    TLS_VARS,
    compose_service_env,
    config_map_data,
    load_compose,
    load_yaml,
    read_env_file,
    render_kustomize_in_python,
    with_tls_stand_ins,
)

# Set per container, not shared: the sites by worker, and the owners map by worker identity
# (compose names workers by hostname, k8s by pod name).
PER_CONTAINER = {"POWERTRIP_SITES", "POWERTRIP_SITE_OWNERS", *TLS_VARS}


def load(service: str, env: dict[str, str]) -> Any:
    try:
        load_config = importlib.import_module("powertrip.services.common.config").load_config
        cls = {
            "aggregator": "powertrip.services.aggregator.config.AggregatorConfig",
            "profiler": "powertrip.services.profiler.config.ProfilerConfig",
        }[service]
        module, _, name = cls.rpartition(".")
        return load_config(getattr(importlib.import_module(module), name), with_tls_stand_ins(env))
    except ImportError as exc:
        pytest.skip(f"service config modules not importable from this checkout: {exc}")


def k8s_settings(variant: str) -> dict[str, str]:
    return config_map_data(render_kustomize_in_python(K8S_VARIANTS[variant]))


def compose_settings(variant: str) -> dict[str, str]:
    service = load_compose(*COMPOSE_VARIANTS[variant])["services"]["aggregator"]
    return compose_service_env(service)


SETTINGS = {"k8s": k8s_settings, "compose": compose_settings}


def test_the_component_is_opt_in():
    root = load_yaml(K8S / "kustomization.yaml")
    assert "components/curtailment" not in root.get("components", [])
    assert load_yaml(CURTAILMENT_COMPONENT / "kustomization.yaml")["kind"] == "Component"
    overlay = load_yaml(CURTAILMENT_VARIANT / "kustomization.yaml")
    assert overlay["resources"] == ["../../k8s"]  # the default variant, whatever it holds
    assert overlay["components"] == ["../../k8s/components/curtailment"]
    assert str(COMPOSE_CURTAILMENT.relative_to(REPO)) == "compose.curtailment.yaml"


@pytest.mark.parametrize("where", sorted(SETTINGS))
def test_default_variant_runs_powertrip_rounds(where):
    assert load("aggregator", SETTINGS[where]("default")).mode == "powertrip"


@pytest.mark.parametrize("where", sorted(SETTINGS))
def test_curtailment_variant_runs_the_curtailment_mode_of_a_preset(where):
    cfg = load("aggregator", SETTINGS[where]("curtailment"))
    assert cfg.mode == "curtailment" and cfg.clock == "emulated"
    presets = importlib.import_module("powertrip.config.curtailment").CURTAIL_PRESETS
    assert cfg.curtail_preset in presets
    cfg.curtailment()  # the preset plus the overrides builds a valid curtailment run


def test_k8s_and_compose_configure_the_curtailment_mode_alike():
    k8s, compose = k8s_settings("curtailment"), compose_settings("curtailment")
    assert {k: v for k, v in compose.items() if k not in PER_CONTAINER} == k8s
    assert read_env_file(CURTAILMENT_ENV).items() <= k8s.items()  # nothing overrides it


@pytest.mark.parametrize("where", sorted(SETTINGS))
def test_profiler_serves_exactly_the_sites_of_the_run(where):
    """The run fails before its first round unless the profiler's curtailment sites are
    site-000 .. NUM_SITES-1; workers are checked to cover exactly NUM_SITES elsewhere."""
    feed = pytest.importorskip("powertrip.services.profiler.feed").CarbonFeed
    env = SETTINGS[where]("curtailment")
    profiler = load("profiler", env)
    sites = feed.build(profiler.curtail_config()).availability
    assert len(sites) == int(env["POWERTRIP_NUM_SITES"])
    aggregator = load("aggregator", env)
    assert aggregator.curtailment() == profiler.curtail_config(
        num_samples=aggregator.num_samples, seed=aggregator.seed
    ), "aggregator and profiler must build the same curtailment run"


def test_deploy_readme_documents_both_ways_in():
    text = (REPO / "deploy" / "README.md").read_text()
    assert "kubectl apply -k deploy/variants/curtailment" in text
    assert "-f compose.yaml -f compose.curtailment.yaml" in text
    assert "powertrip-curtailment" in text
