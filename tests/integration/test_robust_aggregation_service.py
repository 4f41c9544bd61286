"""POWERTRIP_AGGREGATION reaches the aggregator service (reliability row R13): the robust rule
the emulator runs (tests/unit/test_robust_aggregation.py) is the one real workers' updates get."""

from __future__ import annotations

import pytest

from powertrip.config.experiment import build_config
from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.study.powertrip import run_study
from powertrip.v1 import aggregator_pb2


@pytest.mark.slow
@pytest.mark.reliability("R13")
def test_a_real_aggregator_with_the_median_rule_reproduces_the_emulated_median_run(tmp_path):
    """POWERTRIP_AGGREGATION reaches the service's collector: two worker processes, four sites,
    three rounds over real sockets give the emulator's median run's accuracy and loss exactly,
    and not FedAvg's."""
    plan = ClusterPlan(
        workers=2,
        sites=4,
        policy="select-all",
        preset="quick",
        max_rounds=3,
        num_samples=600,
        target=0.99,
        seed=0,
        log_dir=tmp_path / "logs",
        insecure=True,
        round_deadline_s=30,
        extra_env={"POWERTRIP_AGGREGATION": "median"},
    )
    with LocalCluster(plan) as cluster:
        cluster.start()
        status = cluster.wait_done(timeout_s=120)
    assert status.state == aggregator_pb2.RUN_STATE_DONE, status.message
    service = [(r.contributions, r.accuracy, r.loss) for r in status.rounds]
    common = {"num_sites": 4, "num_samples": 600, "policies": ("select-all",), "max_rounds": 3}
    emulated = {}
    for rule in ("median", "fedavg"):
        cfg = build_config("quick", target_accuracy=0.99, aggregation=rule, **common)
        ((_, run),) = run_study(cfg, device="cpu").runs
        emulated[rule] = [(4, r.accuracy, r.loss) for r in run.rounds]
    assert service == emulated["median"]
    assert service != emulated["fedavg"]
