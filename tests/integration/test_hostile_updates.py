"""One authenticated worker sends absurd but finite update values (reliability R33): with the
default settings (mutual TLS, the default ``robust`` aggregation) the run survives.

Three real worker processes over mTLS, one of them hostile (``tests/hostile/sitecustomize.py``:
the real worker, whose uploader replaces what its two sites send). Before robust aggregation was
the default, a raw update of 1e30 everywhere was accepted: the global model went to ~1e29, every
honest update of the next round was NaN and refused, and the run failed ``no_update`` (after a
restart too, from the poisoned checkpoint); 1e6 silently wrecked the model; an int8 payload
whose block scales are all 1e20 did what 1e30 did. Now each such update is dropped as extreme
(counted in ``powertrip_updates_dropped_total``) and the honest sites train on.
"""

from __future__ import annotations

import math
import urllib.request
from pathlib import Path

import pytest

from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.v1 import aggregator_pb2

pytestmark = [pytest.mark.slow, pytest.mark.reliability("R33")]

HOSTILE = "worker-2"  # sites 4 and 5 of 6
ROUNDS = 4
SITECUSTOMIZE = Path(__file__).resolve().parents[1] / "hostile"


class ClusterWithAHostileWorker(LocalCluster):
    """``LocalCluster`` whose worker ``HOSTILE`` runs the attacks ``attacks`` (round by round)."""

    def __init__(self, plan: ClusterPlan, attacks: str) -> None:
        super().__init__(plan)
        self.attacks = attacks

    def _env(self, tls_name: str | None = None, **values: object) -> dict[str, str]:
        env = super()._env(tls_name, **values)
        if tls_name == HOSTILE:
            env["PYTHONPATH"] = f"{SITECUSTOMIZE}:{env.get('PYTHONPATH', '')}"
            env["HOSTILE_ATTACK"] = self.attacks
        return env


def dropped(cluster: LocalCluster) -> float:
    """The aggregator's ``powertrip_updates_dropped_total``, scraped from its /metrics."""
    agg = next(s for s in cluster.services if s.kind == "aggregator")
    with urllib.request.urlopen(agg.metrics_url, timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("powertrip_updates_dropped_total "):
                return float(line.split()[1])
    raise AssertionError("powertrip_updates_dropped_total is not exported")


@pytest.mark.parametrize(
    ("attacks", "env"),
    [
        ("raw:1e30,raw:1e6", {}),
        ("int8-scales:1e20", {"POWERTRIP_CODEC": "int8"}),
    ],
    ids=["raw-1e30-then-1e6", "int8-scales-1e20"],
)
def test_one_hostile_worker_cannot_poison_the_run_with_finite_values(tmp_path, attacks, env):
    plan = ClusterPlan(
        workers=3,
        sites=6,
        policy="select-all",
        preset="quick",
        max_rounds=ROUNDS,
        num_samples=2000,
        target=0.99,
        seed=0,
        log_dir=tmp_path / "logs",
        round_deadline_s=60,
        extra_env=env,
    )
    with ClusterWithAHostileWorker(plan, attacks) as cluster:
        cluster.start()
        status = cluster.wait_done(timeout_s=300)
        assert status.state == aggregator_pb2.RUN_STATE_DONE, status.message
        # every round committed the four honest updates; the hostile two were dropped
        assert [r.contributions for r in status.rounds] == [4] * ROUNDS
        assert dropped(cluster) == 2 * ROUNDS
    losses = [r.loss for r in status.rounds]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]  # the honest sites still train the model
    assert status.rounds[-1].accuracy > 0.15  # above chance (0.1); a poisoned model sits at it
