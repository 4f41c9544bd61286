"""A real Prometheus server scrapes every service of a running cluster; the series the
dashboards query come back from its HTTP API with the right job labels."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from powertrip.v1 import aggregator_pb2
from services.cli.launcher import ClusterPlan, LocalCluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]


def test_prometheus_scrapes_every_service(tmp_path):
    plan = ClusterPlan(
        workers=2, sites=4, policy="select-all", target=0.99, max_rounds=6,
        log_dir=tmp_path / "logs",
    )  # fmt: skip
    with LocalCluster(plan) as cluster:
        cluster.start()
        status = cluster.wait_done(timeout_s=120)
        assert status.state == aggregator_pb2.RUN_STATE_DONE
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
            wanted = {
                "powertrip_model_accuracy_ratio": {"aggregator"},
                'powertrip_rounds_total{outcome="completed"}': {"aggregator"},
                "powertrip_site_power_ratio": {"profiler"},
                "powertrip_site_rtt_seconds": {"profiler"},
                "powertrip_worker_train_duration_seconds_count": {"worker-0", "worker-1"},
                "grpc_server_handled_total": {"aggregator", "profiler", "worker-0", "worker-1"},
            }
            end = time.monotonic() + 60
            while True:
                try:
                    got = {q: {r["metric"]["job"] for r in query(port, q)} for q in wanted}
                except OSError:
                    got = {}
                if got == wanted or time.monotonic() > end:
                    break
                time.sleep(0.5)
            assert got == wanted
            (rounds,) = query(port, 'powertrip_rounds_total{outcome="completed"}')
            assert float(rounds["value"][1]) == status.round
        finally:
            prom.terminate()
            prom.wait(10)
