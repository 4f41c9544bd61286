"""An int8 run over the real services (aggregator, profiler and workers as processes, mutual TLS):
the aggregator assigns the codec, the workers encode with error feedback, and the model improves
as the emulator's int8 run does."""

from __future__ import annotations

import pytest

from powertrip.config.experiment import build_config
from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.study.powertrip import run_study
from powertrip.v1 import aggregator_pb2

pytestmark = pytest.mark.slow


def test_an_int8_run_trains_over_the_services_as_in_the_emulator(tmp_path):
    plan = ClusterPlan(
        workers=2,
        sites=4,
        policy="select-all",
        clock="emulated",
        preset="quick",
        target=0.9,
        max_rounds=8,
        seed=0,
        log_dir=tmp_path / "logs",
        extra_env={"POWERTRIP_CODEC": "int8"},
    )
    with LocalCluster(plan) as cluster:
        cluster.start()
        status = cluster.wait_done(timeout_s=240)
    assert status.state == aggregator_pb2.RUN_STATE_DONE, status.message
    service = [r.accuracy for r in status.rounds]
    assert len(service) == 8 and all(r.contributions == 4 for r in status.rounds)
    assert max(service[-3:]) > service[0] + 0.05  # the model improves

    cfg = build_config(
        "quick",
        num_sites=4,
        policies=("select-all",),
        target_accuracy=0.9,
        max_rounds=8,
        codec="int8",
    )
    ((_, emulated),) = run_study(cfg).runs
    expected = [r.accuracy for r in emulated.rounds[: len(service)]]
    # the same sites, batches and codec with the same residuals; only FedAvg's fold order differs
    assert service == pytest.approx(expected, abs=0.02)
