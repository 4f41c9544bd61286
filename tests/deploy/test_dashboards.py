"""Grafana dashboards and the Prometheus scrape config match what the services expose.

Metric and label names come from the services' metrics modules (read as source), so a renamed
metric breaks this test rather than silently emptying a panel.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import (
    DASHBOARDS,
    METRIC_TYPES,
    MONITORING,
    SERVICES_SRC,
    bundled_monitoring,
    declared_metrics,
    exposed_series,
    find,
    load_yaml,
    tool,
)

DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
DASHBOARD_FILES = sorted(DASHBOARDS.glob("*.json"))
PROMETHEUS_YML = MONITORING / "prometheus" / "prometheus.yml"
DASHBOARDS_MOUNT = "/etc/grafana/dashboards"
TARGET_LABELS = {"job", "instance"}  # added by Prometheus to every scraped series
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def dashboard(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object in a dashboard, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def queries(dash: dict[str, Any]) -> list[str]:
    """PromQL of every panel target and every query variable."""
    exprs = [obj["expr"] for obj in walk(dash.get("panels", [])) if "expr" in obj]
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


class PromQL:
    """The metric names, label names and ``job`` values one query uses (enough of PromQL to
    check names, not a parser)."""

    KEYWORDS = {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan",
    }

    def __init__(self, expr: str) -> None:
        self.expr = expr
        label_values = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", expr)
        if label_values:  # Grafana's variable query: label_values(<selector>, <label>)
            expr = label_values.group(1)
        self.selector = expr  # the PromQL part, Grafana variables left in
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        matchers = re.findall(r'(\w+)\s*(?:=~|!~|!=|=)\s*"([^"]*)"', expr)
        self.labels = {name for name, _ in matchers}
        self.labels |= {label_values.group(2)} if label_values else set()
        self.jobs = {value for name, value in matchers if name == "job" and "$" not in value}
        clause = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"
        for group in re.findall(clause, expr):
            self.labels |= {g.strip() for g in group.split(",") if g.strip()}
        bare = re.sub(clause, " ", re.sub(r'"[^"]*"', '""', expr))
        bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
        bare = re.sub(r"\b\d+(?:\.\d*)?(?:[eE][+-]?\d+)?\b", " ", bare)  # numbers: 3.6e6
        self.metrics = {
            name
            for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?!\s*\(|[a-zA-Z0-9_:])", bare)
            if name not in self.KEYWORDS
        }


def test_promql_reader_finds_metrics_labels_and_jobs():
    q = PromQL(
        'histogram_quantile(0.95, sum by (le, site) (rate(foo_bucket{job="w", site=~"$site"}'
        "[$__rate_interval]))) / on (site) bar_total"
    )
    assert q.metrics == {"foo_bucket", "bar_total"}
    assert q.labels == {"le", "site", "job"}
    assert q.jobs == {"w"}
    assert PromQL("label_values(baz_seconds, site)").metrics == {"baz_seconds"}
    assert PromQL("sum(e_total) / 3.6e6 * 1e-3 + 2").metrics == {"e_total"}


def test_dashboards_dir_holds_the_powertrip_dashboards():
    stems = {p.stem for p in DASHBOARD_FILES}
    assert {"powertrip-rounds", "powertrip-sites", "powertrip-grpc", "powertrip-curtailment"} <= (
        stems
    )


def constructed_metric_names(path: Path) -> set[str]:
    """Names of the prometheus-client metrics a module constructs (``Gauge("name", ...)``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if called in METRIC_TYPES and str(node.args[0].value).startswith("powertrip_"):
                names.add(node.args[0].value)
    return names


def test_every_metric_the_services_define_is_discovered():
    # The name checks below only know metrics found in the metrics modules; one defined anywhere
    # else (a curtailment run module, say) must be moved there or added to the discovery.
    defined = set().union(*(constructed_metric_names(p) for p in SERVICES_SRC.rglob("*.py")))
    assert {"powertrip_mode", "powertrip_energy_joules_total"} <= defined
    assert defined - set(declared_metrics()) == set()


def test_dashboard_uids_are_unique():
    uids = [dashboard(p)["uid"] for p in DASHBOARD_FILES]
    assert len(uids) == len(set(uids))


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_has_a_fixed_uid_named_after_its_file(path):
    dash = dashboard(path)
    assert dash["uid"] == path.stem and dash["title"]
    assert dash.get("id") is None, "exported ids collide across Grafana instances"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_uses_only_the_provisioned_datasource(path):
    dash = dashboard(path)
    refs = [obj["datasource"] for obj in walk(dash) if "datasource" in obj]
    assert refs and all(ref == DATASOURCE for ref in refs)
    for panel in walk(dash.get("panels", [])):
        for target in panel.get("targets", []):
            assert panel.get("datasource") == DATASOURCE or target.get("datasource") == DATASOURCE


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_queries_only_series_the_services_expose(path):
    series = exposed_series()
    for expr in queries(dashboard(path)):
        q = PromQL(expr)
        assert q.metrics, f"no metric in {expr!r}"
        assert q.metrics <= set(series), f"unknown metric in {expr!r}"
        allowed = set().union(*(series[m] for m in q.metrics)) | TARGET_LABELS
        assert q.labels <= allowed, f"unknown label in {expr!r}"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_names_no_job(path):
    # Job names are the scraper's choice: `aggregator` in the shipped prometheus.yml, the
    # Service name under a ServiceMonitor, namespace/name under a PodMonitor. A panel selects
    # by metric (all are powertrip_ or grpc_ series) or by a $job variable filled from
    # label_values(..., job), never by a literal job name.
    for expr in queries(dashboard(path)):
        assert not PromQL(expr).jobs, expr
        assert not re.search(r"\bjob\s*(=|!=|=~|!~)\s*\"[^\"$]", expr), expr


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_queries_are_valid_promql(path, tmp_path):
    promtool = tool("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus): PromQL syntax unchecked")
    rules = []
    for i, query in enumerate(queries(dashboard(path))):
        expr = PromQL(query).selector
        for var, value in {**GRAFANA_VARS, "$site": ".*", "$job": ".*"}.items():
            expr = expr.replace(var, value)
        rules.append({"record": f"check:q{i}", "expr": expr})
    file = tmp_path / "rules.yml"
    file.write_text(yaml.safe_dump({"groups": [{"name": path.stem, "rules": rules}]}))
    out = subprocess.run(
        [promtool, "check", "rules", str(file)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


OPERATOR_VIEWS = {
    "powertrip-rounds": {
        "powertrip_time_to_accuracy_seconds",
        "powertrip_model_accuracy_ratio",
        "powertrip_round_duration_seconds_bucket",
        "powertrip_rounds_total",
        "powertrip_round_sites_selected",
        "powertrip_clock_seconds",
    },
    "powertrip-sites": {
        "powertrip_site_power_ratio",
        "powertrip_site_rtt_seconds",
        "powertrip_site_bandwidth_bytes_per_second",
        "powertrip_site_selected_total",
    },
    "powertrip-grpc": {"grpc_server_handled_total", "grpc_server_handling_seconds_bucket"},
    "powertrip-curtailment": {
        "powertrip_time_to_accuracy_seconds",
        "powertrip_model_accuracy_ratio",
        "powertrip_clock_seconds",
        "powertrip_mode",
        "powertrip_active_sites",
        "powertrip_energy_joules_total",
        "powertrip_emissions_grams_total",
    },
}


@pytest.mark.parametrize(("uid", "needed"), OPERATOR_VIEWS.items())
def test_dashboard_shows_what_operators_watch(uid, needed):
    parsed = [PromQL(e) for e in queries(dashboard(DASHBOARDS / f"{uid}.json"))]
    assert needed <= set().union(*(q.metrics for q in parsed))


def field_metrics(panel: dict[str, Any]) -> dict[str, set[str]]:
    """{field name: metrics of the query}: the name Grafana gives a query's series is its
    legend (one series per query here), which is what a field matcher ``byName`` matches."""
    return {t["legendFormat"]: PromQL(t["expr"]).metrics for t in panel.get("targets", [])}


@pytest.mark.parametrize("uid", ["powertrip-rounds", "powertrip-curtailment"])
def test_dashboard_plots_accuracy_against_the_run_clock(uid):
    # Wall time is the x axis of every time series; an emulated run's progress is against its
    # own clock, which only an XY chart of the two gauges shows.
    (panel,) = [
        p
        for p in walk(dashboard(DASHBOARDS / f"{uid}.json")["panels"])
        if p.get("type") == "xychart"
    ]
    # Without a plugin version Grafana migrates the options as the pre-10.4 schema and loses
    # the field matchers below.
    assert panel.get("pluginVersion")
    fields = field_metrics(panel)
    (series,) = panel["options"]["series"]
    assert panel["options"]["mapping"] == "manual"
    x, y = series["x"]["matcher"], series["y"]["matcher"]
    assert x["id"] == y["id"] == "byName"
    assert fields[x["options"]] == {"powertrip_clock_seconds"}
    assert fields[y["options"]] == {"powertrip_model_accuracy_ratio"}
    # One query per gauge: both are scraped together, so they join on their timestamps into
    # the one frame (byIndex 0) the series reads.
    assert series["frame"]["matcher"] == {"id": "byIndex", "options": 0}
    joins = [t for t in panel.get("transformations", []) if t["id"] == "joinByField"]
    assert [j["options"].get("byField") for j in joins] == ["Time"]


@pytest.mark.parametrize("uid", ["powertrip-rounds", "powertrip-curtailment"])
def test_dashboard_states_the_time_to_accuracy(uid):
    panels = panels_querying(
        dashboard(DASHBOARDS / f"{uid}.json"), "powertrip_time_to_accuracy_seconds"
    )
    assert any(p["type"] == "stat" and p["fieldConfig"]["defaults"]["unit"] == "s" for p in panels)


def test_grpc_error_panels_show_zero_rather_than_no_data_while_all_calls_succeed():
    # The non-OK series only exist once some call has failed; a healthy run must read 0.
    for expr in queries(dashboard(DASHBOARDS / "powertrip-grpc.json")):
        if 'grpc_code!="OK"' in expr:
            assert re.search(r"\bor\b", expr), expr


CURTAILMENT = DASHBOARDS / "powertrip-curtailment.json"


def aggregator_mode_values() -> dict[str, int]:
    """``MODE_VALUE`` of services/aggregator/curtail_run.py: what powertrip_mode is set to."""
    path = SERVICES_SRC / "aggregator" / "curtail_run.py"
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "MODE_VALUE":
            return ast.literal_eval(node.value)
    raise AssertionError(f"no MODE_VALUE in {path}")


def panels_querying(dash: dict[str, Any], metric: str) -> list[dict[str, Any]]:
    return [
        p
        for p in walk(dash.get("panels", []))
        if any(metric in PromQL(t["expr"]).metrics for t in p.get("targets", []))
    ]


def test_curtailment_dashboard_names_every_training_mode():
    values = aggregator_mode_values()
    assert sorted(values.values()) == [0, 1, 2]  # pause, single site, federated
    mode_panels = panels_querying(dashboard(CURTAILMENT), "powertrip_mode")
    assert {p["type"] for p in mode_panels} >= {"state-timeline"}, "mode over time"
    for panel in mode_panels:
        mapped: dict[str, str] = {}
        for mapping in panel["fieldConfig"]["defaults"]["mappings"]:
            if mapping["type"] == "value":
                mapped |= {k: v["text"] for k, v in mapping["options"].items()}
        assert set(mapped) == {str(v) for v in values.values()}, panel["title"]
        assert len(set(mapped.values())) == len(mapped), panel["title"]


@pytest.mark.parametrize(
    "metric", ["powertrip_energy_joules_total", "powertrip_emissions_grams_total"]
)
def test_curtailment_dashboard_shows_cumulative_totals_per_site_and_overall(metric):
    panels = [
        p for p in panels_querying(dashboard(CURTAILMENT), metric) if p["type"] == "timeseries"
    ]
    cumulative = [
        {frozenset(PromQL(t["expr"]).labels) for t in p["targets"]}
        for p in panels
        if not any("rate(" in t["expr"] for t in p["targets"])
    ]
    assert any({frozenset({"site"}), frozenset()} <= groups for groups in cumulative), metric


def test_curtailment_dashboard_shows_the_emissions_rate():
    exprs = [e for e in queries(dashboard(CURTAILMENT)) if "powertrip_emissions_grams_total" in e]
    assert any(re.search(r"\brate\(powertrip_emissions_grams_total\b", e) for e in exprs)


@pytest.mark.parametrize("source", ["powertrip-rounds", "powertrip-sites", "powertrip-grpc"])
def test_curtailment_dashboard_is_linked_from_the_others(source):
    target = dashboard(CURTAILMENT)
    links = dashboard(DASHBOARDS / f"{source}.json").get("links", [])
    assert any(
        (link["type"] == "dashboards" and set(link["tags"]) <= set(target["tags"]))
        or (link["type"] == "link" and target["uid"] in link.get("url", ""))
        for link in links
    )


def test_grpc_dashboard_breaks_requests_out_by_status_code():
    parsed = [PromQL(e) for e in queries(dashboard(DASHBOARDS / "powertrip-grpc.json"))]
    assert any("grpc_code" in q.labels and "grpc_server_handled_total" in q.metrics for q in parsed)


# --------------------------------------------------------------------------------------------
# Grafana provisioning and Prometheus scraping


def test_every_dashboard_is_provisioned_in_k8s():
    component = load_yaml(MONITORING / "kustomization.yaml")
    (gen,) = [g for g in component["configMapGenerator"] if g["name"].endswith("-dashboards")]
    assert sorted(gen["files"]) == [f"dashboards/{p.name}" for p in DASHBOARD_FILES]


def test_grafana_datasource_has_the_fixed_uid_and_the_prometheus_service_url(k8s):
    if not bundled_monitoring(k8s):
        pytest.skip("no bundled Grafana in this variant")
    config = load_yaml(MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
    (source,) = config["datasources"]
    assert {"uid": source["uid"], "type": source["type"]} == DATASOURCE
    host, port = re.fullmatch(r"http://([\w-]+):(\d+)", source["url"]).groups()
    assert int(port) in [p["port"] for p in find(k8s, "Service", host)["spec"]["ports"]]


def test_dashboard_provider_reads_the_mounted_dashboards_and_forbids_ui_edits(k8s):
    if not bundled_monitoring(k8s):
        pytest.skip("no bundled Grafana in this variant")
    config = load_yaml(MONITORING / "grafana" / "provisioning" / "dashboards" / "powertrip.yaml")
    (provider,) = config["providers"]
    assert provider["allowUiUpdates"] is False
    assert provider["options"]["path"] == DASHBOARDS_MOUNT
    grafana = find(k8s, "Deployment", "powertrip-grafana")
    (c,) = grafana["spec"]["template"]["spec"]["containers"]
    assert DASHBOARDS_MOUNT in [m["mountPath"] for m in c["volumeMounts"]]


def test_prometheus_scrapes_every_service_metrics_port(k8s):
    jobs = {job["job_name"]: job for job in load_yaml(PROMETHEUS_YML)["scrape_configs"]}
    assert set(jobs) == {"aggregator", "profiler", "worker"}
    for name in ("aggregator", "profiler"):
        (static,) = jobs[name]["static_configs"]
        assert static["targets"] == [f"powertrip-{name}:8000"]
        ports = find(k8s, "Service", f"powertrip-{name}")["spec"]["ports"]
        assert 8000 in [p["port"] for p in ports]
    (dns,) = jobs["worker"]["dns_sd_configs"]  # every worker pod, however many replicas
    assert dns["type"] == "A" and dns["port"] == 8000
    assert find(k8s, "Service", dns["names"][0])["spec"]["clusterIP"] == "None"


def test_prometheus_config_is_valid():
    promtool = tool("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    out = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(PROMETHEUS_YML)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
