"""A real Prometheus server scrapes every service of a running cluster; the series the
dashboards query come back from its HTTP API with the right job labels, and every query of every
panel returns data while a run unfolds: an emulated run paced for watching, a wall-clock run and
a curtailment run, each scraped with the config ``powertrip up`` writes."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from powertrip.services.cli.launcher import ClusterPlan, LocalCluster, Service
from powertrip.services.cli.up_outputs import write_scrape_config
from powertrip.v1 import aggregator_pb2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed"),
]

DASHBOARDS = Path(__file__).resolve().parents[2] / "deploy/k8s/components/monitoring/dashboards"
#: The dashboards that apply to each aggregator mode; every dashboard is in one of them.
MODE_DASHBOARDS = {
    "powertrip": ("powertrip-rounds", "powertrip-sites", "powertrip-grpc"),
    "curtailment": ("powertrip-curtailment",),
}
#: Grafana's own variables at a 1 s scrape interval (a rate needs two samples in its window).
LIVE_VARS = {"$__rate_interval": "10s", "$__interval": "10s", "$__range": "5m"}
DONE = (aggregator_pb2.RUN_STATE_DONE, aggregator_pb2.RUN_STATE_FAILED)
#: One plan for the powertrip-mode runs: 4 sites, select-all; accuracy 0.557 at round 6 (seed of
#: the quick preset), so the target is reached and time-to-accuracy has a value.
SMALL = {"workers": 2, "sites": 4, "policy": "select-all", "target": 0.5, "max_rounds": 10}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]


WANTED = {
    "powertrip_model_accuracy_ratio": {"aggregator"},
    'powertrip_rounds_total{outcome="completed"}': {"aggregator"},
    "powertrip_site_power_ratio": {"profiler"},
    "powertrip_site_rtt_seconds": {"profiler"},
    "powertrip_worker_train_duration_seconds_count": {"worker-0", "worker-1"},
    "grpc_server_handled_total": {"aggregator", "profiler", "worker-0", "worker-1"},
}


@pytest.fixture(scope="module")
def unpaced_run(tmp_path_factory):
    """An unpaced emulated run of ``SMALL``, scraped by a Prometheus started once it is over,
    one job per service: (status, {query: jobs}, the rounds counter's series). Also the
    reference a paced run must match."""
    tmp_path = tmp_path_factory.mktemp("unpaced")
    plan = ClusterPlan(**SMALL, log_dir=tmp_path / "logs", checkpoint_dir=tmp_path / "ckpt")
    with LocalCluster(plan) as cluster:
        cluster.start()
        status = cluster.wait_done(timeout_s=120)
        jobs = "\n".join(
            f"  - job_name: {s.name}\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{s.metrics_port}']}}]"
            for s in cluster.services
        )
        (tmp_path / "prometheus.yml").write_text(
            f"global: {{scrape_interval: 1s}}\nscrape_configs:\n{jobs}\n"
        )
        port = free_port()
        prom = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "prometheus.log").open("w"),
        )
        try:
            end = time.monotonic() + 60
            while True:
                try:
                    got = {q: {r["metric"]["job"] for r in query(port, q)} for q in WANTED}
                except OSError:
                    got = {}
                if got == WANTED or time.monotonic() > end:
                    break
                time.sleep(0.5)
            rounds = query(port, 'powertrip_rounds_total{outcome="completed"}')
        finally:
            prom.terminate()
            prom.wait(10)
    return status, got, rounds


def test_prometheus_scrapes_every_service(unpaced_run):
    status, got, rounds_series = unpaced_run
    assert status.state == aggregator_pb2.RUN_STATE_DONE
    assert got == WANTED
    (rounds,) = rounds_series
    assert float(rounds["value"][1]) == status.round


# --------------------------------------------------------------------------------------------
# Every panel, live


def panel_queries(uid: str) -> dict[str, str]:
    """{"<dashboard> / <panel> [<refId>]": PromQL} for every target of every panel (rows'
    nested panels too), and {"<dashboard> / $<variable>": selector} for query variables."""
    dash = json.loads((DASHBOARDS / f"{uid}.json").read_text())
    found: dict[str, str] = {}

    def visit(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for t in panel.get("targets", []):
                if "expr" in t:
                    found[f"{uid} / {panel['title']} [{t['refId']}]"] = t["expr"]
            visit(panel.get("panels", []))

    visit(dash.get("panels", []))
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            selector = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", q)
            found[f"{uid} / ${var['name']}"] = selector.group(1) if selector else q
    return found


def live_promql(expr: str) -> str:
    """The query Grafana would send: its own variables at a 1 s scrape, every template
    variable (``$site``, ``${job}``) as "All"."""
    for var, value in LIVE_VARS.items():
        expr = expr.replace(var, value)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def has_data(result: list[dict]) -> bool:
    """At least one series with a number: a NaN (time-to-accuracy before the target, a
    quantile of no events) is a series Grafana shows as empty."""
    return any(not math.isnan(float(r["value"][1])) for r in result)


class Prometheus:
    """A throw-away Prometheus on a free port, scraping what ``config`` lists (reloaded on
    ``reload()``, so it can start before the cluster it will scrape)."""

    def __init__(self, tmp_path: Path, config: Path) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "prometheus.log").open("w"),
        )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the HTTP API answers: a SIGHUP before Prometheus handles it would end it, and a
        config loaded late would miss the first rounds of a short run."""
        end = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                    return
            except OSError:
                assert self.process.poll() is None, "prometheus exited at start"
                assert time.monotonic() < end, f"prometheus not ready within {timeout_s} s"
                time.sleep(0.2)

    def reload(self) -> None:
        self.process.send_signal(signal.SIGHUP)

    def wait_scraped(self, service: Service, timeout_s: float = 30.0) -> None:
        """Until ``service``'s metrics endpoint has been scraped once (its ``up`` series is 1)."""
        target = service.metrics_url.split("//", 1)[1].split("/", 1)[0]
        end = time.monotonic() + timeout_s
        while not any(float(r["value"][1]) == 1 for r in self.query(f'up{{instance="{target}"}}')):
            assert time.monotonic() < end, f"{service.name} not scraped within {timeout_s} s"
            time.sleep(0.2)

    def query(self, promql: str) -> list[dict]:
        try:
            return query(self.port, promql)
        except (OSError, urllib.error.HTTPError, KeyError):
            return []  # not up yet

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@contextmanager
def scraped_cluster(
    plan: ClusterPlan, tmp_path: Path
) -> Iterator[tuple[LocalCluster, Prometheus, float]]:
    """The cluster of ``plan``, scraped every second with the config ``powertrip up`` writes;
    each service is scraped once before the next starts, so a short run (training begins as the
    last worker registers) is watched from its first round. Also yields when the last service
    was ready (``time.monotonic()``): when training began."""
    config = write_scrape_config(tmp_path / "prometheus.yml", [])
    prom = Prometheus(tmp_path, config)
    try:
        prom.wait_ready()
        with LocalCluster(plan) as cluster:
            started: list[Service] = []
            ready_at = [0.0]

            def scrape(service: Service) -> None:
                ready_at[0] = time.monotonic()
                started.append(service)
                write_scrape_config(config, started)
                prom.reload()
                prom.wait_scraped(service)

            cluster.start(on_started=scrape)
            yield cluster, prom, ready_at[0]
    finally:
        prom.stop()


def watch_every_panel(
    cluster: LocalCluster, prom: Prometheus, mode: str, grace_s: float = 15.0
) -> aggregator_pb2.GetStatusResponse:
    """Query every panel of ``mode``'s dashboards each second while the run goes on, until each
    has returned data once; fail naming the panels that never did by ``grace_s`` after the end."""
    pending = {
        name: live_promql(expr)
        for uid in MODE_DASHBOARDS[mode]
        for name, expr in panel_queries(uid).items()
    }
    ended_at = None
    while True:
        pending = {n: q for n, q in pending.items() if not has_data(prom.query(q))}
        status = cluster.status()
        if status.state in DONE and ended_at is None:
            ended_at = time.monotonic()
        if not pending or (ended_at is not None and time.monotonic() - ended_at > grace_s):
            break
        time.sleep(1.0)
    assert not pending, f"no data in a live {mode} run ({status.message or 'running'}):\n" + (
        "\n".join(f"  {n}: {q}" for n, q in pending.items())
    )
    return status


def round_results(status: aggregator_pb2.GetStatusResponse) -> list[tuple]:
    return [
        (r.round, r.clock_seconds, r.accuracy, r.loss, tuple(r.selected_site_ids), r.outcome)
        for r in status.rounds
    ]


def test_every_dashboard_is_watched_in_some_mode():
    watched = {uid for uids in MODE_DASHBOARDS.values() for uid in uids}
    assert watched == {p.stem for p in DASHBOARDS.glob("*.json")}


def test_a_paced_emulated_run_fills_every_panel_and_ends_as_an_unpaced_one(tmp_path, unpaced_run):
    unpaced, _, _ = unpaced_run
    pace = 40.0  # run-clock s per wall s: 6 rounds of 86 s take ~13 s instead of ~4 s
    plan = ClusterPlan(
        **SMALL, pace=pace, log_dir=tmp_path / "logs", checkpoint_dir=tmp_path / "checkpoints"
    )
    with scraped_cluster(plan, tmp_path) as (cluster, prom, began):
        watch_every_panel(cluster, prom, "powertrip")
        status = cluster.wait_done(timeout_s=120)
        took = time.monotonic() - began
    assert status.state == unpaced.state == aggregator_pb2.RUN_STATE_DONE, status.message
    assert round_results(status) == round_results(unpaced)  # pacing changes only wall time
    assert status.time_to_accuracy_seconds == unpaced.time_to_accuracy_seconds > 0
    assert took >= status.clock_seconds / pace - 1.0


def test_a_wall_clock_run_fills_every_panel(tmp_path):
    # Target 0.8 (~15 rounds) instead of SMALL's 0.5 (~6): a rate() needs two scrapes, 1 s
    # apart, around a round's observation, and since training got faster 0.5 could be reached
    # ~5 s after the start, before Prometheus had scraped the round histograms twice.
    run = {**SMALL, "target": 0.8, "max_rounds": 40}
    plan = ClusterPlan(
        **run, clock="wall", log_dir=tmp_path / "logs", checkpoint_dir=tmp_path / "checkpoints"
    )
    with scraped_cluster(plan, tmp_path) as (cluster, prom, _):
        status = watch_every_panel(cluster, prom, "powertrip")
    assert status.state != aggregator_pb2.RUN_STATE_FAILED, status.message


def test_a_curtailment_run_fills_every_panel(tmp_path):
    # curtailment-quick: one site per region of the trace, 3 workers; the data is used up at
    # ~14.6 h of run clock, accuracy passes 0.16 at ~4.4 h: ~6 s paced at 2500 s per s.
    plan = ClusterPlan(
        workers=3,
        sites=3,
        mode="curtailment",
        curtail_preset="curtailment-quick",
        target=0.16,
        pace=2500.0,
        log_dir=tmp_path / "logs",
    )
    with scraped_cluster(plan, tmp_path) as (cluster, prom, began):
        status = watch_every_panel(cluster, prom, "curtailment")
        took = time.monotonic() - began
    assert status.state != aggregator_pb2.RUN_STATE_FAILED, status.message
    assert status.clock_seconds > 0 and took >= status.clock_seconds / plan.pace - 1.0  # paced
