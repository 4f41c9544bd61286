"""Dashboard queries that hold whatever the scraper calls its jobs, and energy in base units.

The shipped Prometheus names its jobs aggregator/profiler/worker, the Prometheus Operator after
the Service (ServiceMonitor) or namespace/name (PodMonitor); the panels must read the same under
both. Energy is exported in joules (Prometheus' base unit) and shown in kWh.
"""

from __future__ import annotations

import ast
import re

from tests.deploy.support import DASHBOARDS, SERVICES_SRC, declared_metrics
from tests.deploy.test_dashboards import PromQL, dashboard, queries, walk

ENERGY = "powertrip_energy_joules_total"
JOULES_PER_KWH = 3.6e6
CURTAILMENT = DASHBOARDS / "powertrip-curtailment.json"


def metrics_constructed_in(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        first = node.args[0] if isinstance(node, ast.Call) and node.args else None
        if isinstance(first, ast.Constant) and str(first.value).startswith("powertrip_"):
            names.add(first.value)
    return names


def aggregator_only_metrics() -> set[str]:
    """Metrics the aggregator's metrics module constructs and no other service's does."""
    own = metrics_constructed_in(SERVICES_SRC / "aggregator" / "metrics.py")
    others = set().union(
        *(
            metrics_constructed_in(p)
            for p in SERVICES_SRC.rglob("metrics.py")
            if p.parent.name != "aggregator"
        )
    )
    return own - others


def test_energy_is_exported_in_joules_and_no_longer_in_kwh():
    metric = declared_metrics()[ENERGY]
    assert metric.type == "Counter" and metric.labels == {"site"}
    assert not [m for m in declared_metrics() if "kwh" in m]


def test_the_curtailment_run_counts_joules():
    source = (SERVICES_SRC / "aggregator" / "curtail_run.py").read_text()
    (inc,) = re.findall(r"metrics\.ENERGY\.labels\([^)]*\)\.inc\((.*)\)\n", source)
    assert "JOULES_PER_KWH" in inc, inc  # the study's kWh, converted where it is counted
    tree = ast.parse((SERVICES_SRC / "aggregator" / "metrics.py").read_text())
    (value,) = [
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "JOULES_PER_KWH"
    ]
    assert value == JOULES_PER_KWH


def test_every_energy_query_of_the_curtailment_dashboard_is_in_kwh():
    exprs = [e for e in queries(dashboard(CURTAILMENT)) if ENERGY in PromQL(e).metrics]
    assert exprs
    for expr in exprs:
        if expr.strip().startswith("label_values("):
            continue
        assert re.search(r"/\s*3\.6e6\b", expr), f"joules shown as kWh: {expr}"


def test_the_curtailment_dashboard_has_a_kwh_panel_derived_from_joules():
    kwh_panels = [
        p
        for p in walk(dashboard(CURTAILMENT)["panels"])
        if p.get("fieldConfig", {}).get("defaults", {}).get("unit") == "kwatth"
        and any(ENERGY in PromQL(t["expr"]).metrics for t in p.get("targets", []))
    ]
    assert {p["type"] for p in kwh_panels} >= {"stat", "timeseries"}


def test_the_update_traffic_panel_keeps_the_aggregators_side_without_a_job_name():
    # Workers count the bytes they send under the same metric: the aggregator's series are
    # selected by joining on the scrape target with a metric only the aggregator exports.
    exprs = [
        e
        for e in queries(dashboard(DASHBOARDS / "powertrip-sites.json"))
        if "powertrip_update_bytes_total" in PromQL(e).metrics
    ]
    assert exprs
    only_aggregator = aggregator_only_metrics()
    for expr in exprs:
        joined = re.search(r"\band on \(instance\) (\w+)", expr)
        assert joined and joined.group(1) in only_aggregator, expr
        assert "job" not in PromQL(expr).labels, expr
