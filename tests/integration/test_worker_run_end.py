"""A finished run ends its workers (POWERTRIP_EXIT_WHEN_DONE), on real processes over mutual
TLS: the aggregator serves its DONE status for one worker lease, each worker hears it through
GetStatus after a heartbeat and exits 0, and then the aggregator exits 0. This is what lets the
Kubernetes workers end with the aggregator Job (deploy/README.md "A run that completes")."""

from __future__ import annotations

import subprocess

import pytest

from powertrip.services.cli.launcher import ClusterPlan, LocalCluster

pytestmark = pytest.mark.slow


def test_workers_exit_0_once_the_run_is_done_and_the_aggregator_after_them(tmp_path):
    plan = ClusterPlan(
        workers=2,
        sites=4,
        policy="select-all",
        preset="quick",
        max_rounds=2,  # DONE after two rounds, at the target or not
        num_samples=2000,
        seed=0,
        log_dir=tmp_path / "logs",
        extra_env={"POWERTRIP_EXIT_WHEN_DONE": "1"},  # every service reads its own
    )
    with LocalCluster(plan) as cluster:
        cluster.start()
        exits = {}
        for service in cluster.services:
            if service.kind == "profiler":
                continue  # serves on: the profiler has no run to finish
            try:
                exits[service.name] = service.process.wait(300)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{service.name} still running 300 s after start")
        profiler_alive = cluster.services[0].process.poll() is None
    assert exits == {"aggregator": 0, "worker-0": 0, "worker-1": 0}
    assert profiler_alive
    for wid in plan.worker_ids:
        log = (plan.log_dir / f"{wid}.log").read_text()
        assert f"the run is done: worker {wid} exits" in log
        assert "Traceback" not in log
