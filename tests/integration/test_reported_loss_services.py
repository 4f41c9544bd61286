"""A worker's reported training loss is a claim (reliability R36): over real processes, a hostile
worker that says its site's loss is 1e300 in every round gains that site nothing under Oort.

Before the bound (b97b2b6) the aggregator passed 1e300 to Oort, which picked the claiming site in
nearly every round. Here one worker process hosts all the sites and lies for one of them (its
uploads are the real worker's, with the header's ``train_loss`` replaced: a ``sitecustomize``
hook, so the worker code is unchanged); the aggregator refuses the claim, counts it, and the
site is picked about as often as its honest twin on the same worker.
"""

from __future__ import annotations

import os
import urllib.request

import pytest

from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.v1 import aggregator_pb2

pytestmark = pytest.mark.slow

ROUNDS, SITES = 40, 8  # Oort picks ceil(0.2 * 8) = 2 sites a round
HOSTILE, TWIN = "site-005", "site-004"

#: imported by every Python process that has its folder on PYTHONPATH; acts in the worker only
HOOK = """
import os

if os.environ.get("POWERTRIP_WORKER_ID"):
    from powertrip.services.worker import uploader

    honest_header = uploader._update_header
    site, claim = os.environ["R36_HOSTILE_SITE"], float(os.environ["R36_HOSTILE_LOSS"])

    def hostile_header(*args, **kwargs):
        head = honest_header(*args, **kwargs)
        if head.site_id == site:
            head.train_loss = claim
        return head

    uploader._update_header = hostile_header
"""


def refused_above_ceiling(cluster: LocalCluster) -> float:
    """The aggregator's count of train_loss claims above the ceiling, scraped from /metrics."""
    with urllib.request.urlopen(cluster.aggregator.metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    want = 'powertrip_reported_values_refused_total{field="train_loss",reason="above_ceiling"}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(want))


@pytest.mark.reliability("R36")
def test_a_worker_claiming_a_huge_loss_gains_its_site_no_selections_under_oort(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)
    plan = ClusterPlan(
        workers=1,
        sites=SITES,
        policy="oort",
        clock="emulated",
        preset="quick",
        num_samples=400,
        partition="iid",
        target=0.99,
        max_rounds=ROUNDS,
        seed=0,
        log_dir=tmp_path / "logs",
        insecure=True,
        round_deadline_s=60,
        extra_env={"PYTHONPATH": path, "R36_HOSTILE_SITE": HOSTILE, "R36_HOSTILE_LOSS": "1e300"},
    )
    with LocalCluster(plan) as cluster:
        cluster.start()
        status = cluster.wait_done(timeout_s=600)
        refused = refused_above_ceiling(cluster)
    assert status.state == aggregator_pb2.RUN_STATE_DONE, status.message
    assert len(status.rounds) == ROUNDS
    picked = {f"site-{i:03d}": 0 for i in range(SITES)}
    for r in status.rounds:
        assert r.contributions == len(r.selected_site_ids), r  # every update was folded
        for s in r.selected_site_ids:
            picked[s] += 1
    # each of the hostile site's rounds: its claim refused and counted, never passed on
    assert refused == picked[HOSTILE] > 0, (refused, picked)
    # within noise of its twin (2 sd of a site's share of 80 picks), and no more than any site
    # is picked honestly (before the bound: in nearly every round)
    assert picked[HOSTILE] <= picked[TWIN] + 6, picked
    assert picked[HOSTILE] <= max(n for s, n in picked.items() if s != HOSTILE), picked
