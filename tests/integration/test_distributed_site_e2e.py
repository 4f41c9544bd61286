"""Sites that are GPU clusters, through the real services: two workers, each training its one
site over two gloo ranks (POWERTRIP_SITE_RANKS=2, the site engine), send each update as two
bfloat16 shard streams over mutual TLS, and the run trains to its round budget. A rank
SIGKILLed after a round fails its site's next round cleanly: the aggregator commits that round
without the site (it sees a failed site, never a hang) and the site is back, on fresh ranks, in
the round after.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.v1 import aggregator_pb2

pytestmark = pytest.mark.slow

ROUNDS = 4


def plan(out: Path) -> ClusterPlan:
    return ClusterPlan(
        workers=2,
        sites=2,
        policy="static-2",  # both sites every round: a missing update is the rank's doing
        preset="quick",
        num_samples=600,
        target=0.99,  # unreachable: the run goes through its whole round budget
        max_rounds=ROUNDS,
        seed=0,
        round_deadline_s=15,  # what the killed rank's round costs: its site never uploads
        log_dir=out / "logs",
        checkpoint_dir=out / "ckpt",
        tls_dir=out / "tls",
        extra_env={
            "POWERTRIP_SITE_RANKS": "2",
            "POWERTRIP_DEVICE": "cpu",
            "POWERTRIP_UPLOAD_DTYPE": "bfloat16",  # half the bytes, widened as they fold
        },
    )


def rank_pids(worker_pid: int) -> list[int]:
    """The worker's spawned rank processes (its children running multiprocessing's spawn)."""
    pids = []
    for task in Path(f"/proc/{worker_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in cmd:  # not the resource tracker
                pids.append(int(child))
    return sorted(pids)


def wait_for(cond, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    while not (got := cond()):
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


@pytest.mark.reliability("R32")
def test_two_rank_sites_train_and_a_killed_rank_fails_only_its_sites_round(tmp_path):
    with LocalCluster(plan(tmp_path)) as c:
        c.start()
        worker = next(s for s in c.services if s.name == "worker-0")
        wait_for(lambda: c.status().round >= 1, 120, "round 1")
        ranks = wait_for(lambda: rank_pids(worker.process.pid), 30, "worker-0's ranks")
        assert len(ranks) == 2, ranks
        killed_after = c.status().round
        os.kill(ranks[1], signal.SIGKILL)
        time.sleep(1.0)
        assert worker.process.poll() is None  # the worker itself stays up
        st = c.wait_done(timeout_s=240)
        log = worker.log_path.read_text(errors="replace") if worker.log_path else ""

    assert st.state == aggregator_pb2.RUN_STATE_DONE and st.round == ROUNDS, st.message
    got = {r.round: r.contributions for r in st.rounds}
    assert got[1] == 2  # both sites, each as two shard streams
    assert all(r.outcome == "completed" for r in st.rounds), [r.outcome for r in st.rounds]
    short = [r for r, n in got.items() if n < 2]
    assert len(short) == 1 and short[0] > killed_after - 1, got  # the killed rank's round only
    assert got[ROUNDS] == 2  # fresh ranks: the site is back
    assert "rank 1" in log and "exited" in log, log[-2000:]
