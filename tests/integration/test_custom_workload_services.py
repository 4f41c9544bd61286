"""A user's own workload, named by reference, trains in the real services as in the emulator:
the aggregator and every worker import it (POWERTRIP_WORKLOAD=package.module:attribute)."""

from __future__ import annotations

import pytest

from powertrip.config.experiment import build_config
from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.study.powertrip import run_study
from powertrip.v1 import aggregator_pb2

pytestmark = pytest.mark.slow

WORKLOAD = "tests.workloads:normalised_blobs"  # BatchNorm + dropout: sites train in turn


def test_a_custom_workload_trains_in_the_services_as_in_the_emulator(tmp_path):
    plan = ClusterPlan(
        workers=2,
        sites=4,
        policy="select-all",
        clock="emulated",
        preset="quick",
        target=0.9,
        max_rounds=8,
        seed=0,
        workload=WORKLOAD,
        log_dir=tmp_path / "logs",
    )
    with LocalCluster(plan) as cluster:
        cluster.start()
        status = cluster.wait_done(timeout_s=180)
    assert status.state == aggregator_pb2.RUN_STATE_DONE, status.message
    assert status.time_to_accuracy_seconds > 0

    cfg = build_config(
        "quick",
        workload=WORKLOAD,
        num_sites=4,
        policies=("select-all",),
        target_accuracy=0.9,
        max_rounds=8,
    )
    ((_, emulated),) = run_study(cfg).runs
    service = [r.accuracy for r in status.rounds]
    expected = [r.accuracy for r in emulated.rounds[: len(service)]]
    # the same sites train the same batches; only the fold order of FedAvg differs
    assert service == pytest.approx(expected, abs=0.01)
