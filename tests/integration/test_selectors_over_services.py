"""The literature selectors and the forecast / joint policies run over the real services: Oort gets
each site's training loss and sample count from the workers' updates (not the validation-loss
fallback), and the policies that read the aggregator's forecast (POWERTRIP_FORECAST) select.

One profiler and one worker (4 sites) serve every policy: the aggregator is restarted with the
next policy on the same port, and the worker's heartbeat registers it with the new run."""

from __future__ import annotations

import math
import re

import pytest

from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.v1 import aggregator_pb2

pytestmark = pytest.mark.slow

ROUNDS = 3
REPORTED = re.compile(r"round (\d+): per-site training loss \[([^\]]*)\], samples \[([^\]]*)\]")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    plan = ClusterPlan(
        workers=1,
        sites=4,
        policy="oort",
        clock="emulated",
        preset="quick",
        target=0.99,
        max_rounds=ROUNDS,
        seed=0,
        log_dir=tmp_path_factory.mktemp("selectors") / "logs",
        insecure=True,
        extra_env={"POWERTRIP_LOG_LEVEL": "DEBUG"},
    )
    with LocalCluster(plan) as c:
        c.start()
        yield c


def finished(cluster: LocalCluster, policy: str) -> aggregator_pb2.GetStatusResponse:
    status = cluster.wait_done(timeout_s=120)
    assert status.state == aggregator_pb2.RUN_STATE_DONE, status.message
    assert status.policy == policy and len(status.rounds) == ROUNDS
    for r in status.rounds:  # every round selected sites and folded their updates
        assert r.selected_site_ids and r.contributions == len(r.selected_site_ids), r
    return status


def test_oort_gets_each_sites_training_loss_over_the_services(cluster):
    status = finished(cluster, "oort")
    log = cluster.aggregator.log_path.read_text()
    reports = {int(m[1]): (m[2], m[3]) for m in REPORTED.finditer(log)}
    assert sorted(reports) == [r.round for r in status.rounds], log[-2000:]
    for r in status.rounds:
        loss, samples = ([float(v) for v in s.split(",")] for s in reports[r.round])
        assert len(loss) == len(samples) == len(r.selected_site_ids)
        assert all(math.isfinite(v) and v >= 0 for v in loss)
        # n_i: the site's partition of the quick preset's samples, a whole positive count
        assert all(v >= 1 and v == int(v) for v in samples)
    assert "reported train_loss" not in log and "reported num_samples" not in log


@pytest.mark.parametrize(
    ("policy", "env"),
    [("powertrip-forecast", {"POWERTRIP_FORECAST": "persistence"}), ("powertrip-joint", {})],
)
def test_forecast_and_joint_policies_select_over_the_services(cluster, policy, env):
    cluster.restart("aggregator", POWERTRIP_POLICY=policy, **env)
    finished(cluster, policy)
