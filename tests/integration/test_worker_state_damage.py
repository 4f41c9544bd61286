"""A worker whose saved optimizer states were damaged while it was down (R35) keeps serving:
restarted onto a state file with NaN moments, and later onto a cut one, it sets the file aside
with one line saying which and why, its sites start fresh, and their updates are accepted in
the next rounds. Before, the NaN moments were resumed silently (every later update of those
sites NaN and refused, the NaN state saved again each round) and the cut file stopped the
worker at start, so a restart policy looped on it.

The restarts land between rounds as in ``test_worker_state_restart`` (the aggregator frozen in
its pace's hold while the worker is down), so every round is sent to every site: ``select-all``
selects each in each round, and a round's contributions count the accepted updates.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.v1 import aggregator_pb2
from tests.integration.test_worker_state_restart import (
    log_sizes,
    logged_since,
    respawn,
    service,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.reliability("R35")]

SITES = 4
STATES = "site-states.pt"
VICTIM = "worker-1"  # hosts site-002 and site-003
ADAMW = json.dumps({"name": "adamw", "lr": 1e-3})


def plan(out: Path, rounds: int) -> ClusterPlan:
    return ClusterPlan(
        workers=2,
        sites=SITES,
        policy="select-all",
        clock="emulated",
        pace=40.0,  # ~2 s of wall time a round: the hold after each is where a restart lands
        preset="quick",
        num_samples=1000,
        target=0.99,  # unreachable: the run goes through its whole round budget
        max_rounds=rounds,
        seed=0,
        round_deadline_s=10,
        log_dir=out / "logs",
        checkpoint_dir=out / "ckpt",
        tls_dir=out / "tls",
        extra_env={
            "POWERTRIP_HEARTBEAT_S": "0.5",
            "POWERTRIP_HEARTBEAT_PATIENCE": "60",  # the lease outlasts the restart
            "POWERTRIP_LOCAL_OPTIMIZER": ADAMW,
            "POWERTRIP_WORKER_STATE_DIR": str(out / "worker-state"),
        },
    )


def nan_moments(path: Path) -> None:
    """Every saved moment of every site NaN, the file otherwise well-formed and this run's."""
    raw = torch.load(path, weights_only=True)
    for site in raw["states"].values():
        for kinds in site["moments"].values():
            for t in kinds.values():
                t.fill_(float("nan"))
    torch.save(raw, path)


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def restart_onto(c: LocalCluster, after: int, damage: Callable[[Path], None]) -> str:
    """Freeze the aggregator in its hold after round ``after``, SIGKILL the victim, ``damage``
    its state file, start it again and thaw the aggregator once it has rejoined; what the
    restarted worker logged until then."""
    agg = c.aggregator.process
    wait_for(lambda: c.status().round >= after, 60, f"round {after}")
    agg.send_signal(signal.SIGSTOP)
    try:
        sent = f"StartRound] round={after + 1} " in logged_since(c, VICTIM, {})
        assert not sent, f"the freeze missed the gap after round {after}: machine too slow"
        service(c, VICTIM).process.kill()
        service(c, VICTIM).process.wait()
        damage(Path(service(c, VICTIM).env["POWERTRIP_WORKER_STATE_DIR"]) / VICTIM / STATES)
        since = log_sizes(c)
        new = respawn(c, VICTIM)

        def rejoined() -> bool:
            assert new.process.poll() is None, "the restarted worker exited"
            return "rejoining" in logged_since(c, VICTIM, since)

        wait_for(rejoined, 60, "the restarted worker rebuilding its sites")
    finally:
        agg.send_signal(signal.SIGCONT)
    new.wait_ready(60)
    return logged_since(c, VICTIM, since)


def set_aside_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if f"{STATES} set aside as" in line]


def test_a_worker_restarted_onto_a_damaged_state_file_sets_it_aside_and_keeps_contributing(
    tmp_path,
):
    rounds = 3
    with LocalCluster(plan(tmp_path, rounds)) as c:
        c.start()
        nan_log = restart_onto(c, 1, nan_moments)
        cut_log = restart_onto(c, 2, cut)
        st = c.wait_done(timeout_s=120)
        states = tmp_path / "worker-state" / VICTIM
    assert st.state == aggregator_pb2.RUN_STATE_DONE and st.round == rounds, st.message
    (nan_line,) = set_aside_lines(nan_log)
    assert re.search(
        rf"{STATES} set aside as {STATES}\.bad-\S+: non-finite moments \(NaN in exp_avg of "
        r"'[^']+'\); site-002, site-003 start fresh$",
        nan_line,
    ), nan_line
    (cut_line,) = set_aside_lines(cut_log)
    assert re.search(
        rf"set aside as {STATES}\.bad-\S+: truncated \(\d+ bytes; the end of the file is "
        r"missing\); site-002, site-003 start fresh$",
        cut_line,
    ), cut_line
    assert "weights_only" not in cut_log + nan_log
    assert len(list(states.glob(f"{STATES}.bad-*"))) == 2  # both kept for a person to read
    # every site's update is accepted in every round, the victim's after each restart too
    assert [(r.round, len(r.selected_site_ids), r.contributions) for r in st.rounds] == [
        (r, SITES, SITES) for r in range(1, rounds + 1)
    ]
    saved = torch.load(states / STATES, weights_only=True)["states"]  # written after round 3
    assert sorted(saved) == [2, 3]
    assert all(finite(s["moments"]) for s in saved.values())


def finite(moments: dict[str, dict[str, torch.Tensor]]) -> bool:
    return all(bool(torch.isfinite(t).all()) for m in moments.values() for t in m.values())
