"""A worker SIGKILLed between rounds and restarted with its state directory
(POWERTRIP_WORKER_STATE_DIR) rejoins the run so that the run ends with the same final model,
bit for bit, as an uninterrupted one, with a stateful local optimizer (AdamW, kept moments).

Between rounds: a pace (POWERTRIP_PACE) holds the aggregator a moment after each round of the
restarted runs (the uninterrupted one runs unpaced: the emulated clock, and so the result, does
not depend on the pace, only the wall time does); the test freezes it (SIGSTOP) in that hold,
kills the worker, starts it again on its port, waits until it has rebuilt its sites from the
saved run and resumed their optimizer states, and thaws the aggregator (SIGCONT): no round is
dispatched while the worker is down. The leases outlast the restart (a long heartbeat
patience), so the restarted worker's sites stay in the selection; it registers as ready at
once. The negative control restarts the worker the same way after deleting its saved optimizer
states: its sites start from zero moments and the final model differs, so the comparison can
fail.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from powertrip.services.cli.launcher import ClusterPlan, LocalCluster, Service
from powertrip.services.cli.service_process import start_service
from powertrip.v1 import aggregator_pb2
from tests.integration.test_crash_recovery import model_sha256, rounds

pytestmark = pytest.mark.slow

ROUNDS = 3
SITES = 4
PACE = 40.0  # run-clock seconds per wall second: ~86 s a round, ~2 s of wall time each
ADAMW = json.dumps({"name": "adamw", "lr": 1e-3})


def plan(out: Path) -> ClusterPlan:
    return ClusterPlan(
        workers=2,
        sites=SITES,
        policy="powertrip",
        clock="emulated",
        pace=0.0,  # the uninterrupted run: as fast as it goes; ``run`` paces the others
        preset="quick",
        num_samples=1000,
        target=0.99,  # unreachable: every run goes through its whole round budget
        max_rounds=ROUNDS,
        seed=0,
        round_deadline_s=10,
        log_dir=out / "logs",
        checkpoint_dir=out / "ckpt",
        tls_dir=out / "tls",
        extra_env={
            "POWERTRIP_HEARTBEAT_S": "0.5",
            "POWERTRIP_HEARTBEAT_PATIENCE": "60",  # a 31 s lease: it outlasts the restart
            "POWERTRIP_LOCAL_OPTIMIZER": ADAMW,
            "POWERTRIP_WORKER_STATE_DIR": str(out / "worker-state"),
        },
    )


def service(c: LocalCluster, name: str) -> Service:
    return next(s for s in c.services if s.name == name)


def wait_for(cond, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    while not (got := cond()):
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)
    return got


def log_sizes(c: LocalCluster) -> dict[str, int]:
    return {s.name: s.log_path.stat().st_size for s in c.services if s.log_path is not None}


def logged_since(c: LocalCluster, name: str, since: dict[str, int]) -> str:
    log = service(c, name).log_path
    assert log is not None
    with log.open("rb") as f:
        f.seek(since.get(name, 0))
        return f.read().decode(errors="replace")


def restart_between_rounds(
    c: LocalCluster, name: str, after: int, keep_states: bool, since: dict[str, int]
) -> None:
    """Freeze the aggregator in its hold after round ``after``, SIGKILL worker ``name`` and
    start it again on its port (its saved optimizer states deleted unless ``keep_states``),
    thaw the aggregator once the worker has rebuilt its sites. ``since``: where this run's
    lines begin in each log."""
    agg = c.aggregator.process
    wait_for(lambda: c.status().round >= after, 60, f"round {after}")
    agg.send_signal(signal.SIGSTOP)
    try:
        for w in c.plan.worker_ids:  # frozen in the pace's hold: the next round not sent
            sent = f"StartRound] round={after + 1} " in logged_since(c, w, since)
            assert not sent, f"the freeze missed the gap after round {after}: machine too slow"
        states = Path(service(c, name).env["POWERTRIP_WORKER_STATE_DIR"]) / name
        log_from = log_sizes(c)
        proc = service(c, name).process
        proc.kill()
        proc.wait()
        if not keep_states:
            (states / "site-states.pt").unlink()
        new = respawn(c, name)

        def rebuilt() -> bool:
            assert new.process.poll() is None, "the restarted worker exited"
            return "rejoining" in logged_since(c, name, log_from)

        wait_for(rebuilt, 60, "the restarted worker rebuilding its sites")
    finally:
        agg.send_signal(signal.SIGCONT)
    new.wait_ready(60)


def respawn(c: LocalCluster, name: str, **env: str) -> Service:
    """SIGKILL ``name`` and start it again on its port with ``env`` changed; not waited for."""
    old = service(c, name)
    old.process.kill()
    old.process.wait()
    c.services.remove(old)
    env = {**old.env, **env, "POWERTRIP_GRPC_PORT": old.grpc_addr.rsplit(":", 1)[1]}
    new = start_service(name, old.kind, env, c.plan.log_dir)
    c.services.append(new)
    return new


def run(c: LocalCluster, out: Path, kill: tuple[str, int, bool] | None = None):
    """One run on ``c`` with its checkpoints and worker states in ``out``: the aggregator and
    the workers started afresh on their ports, all at once (they retry registration until the
    aggregator answers), so no in-memory state of the last run leaks in; the profiler stays."""
    for w in c.plan.worker_ids:  # first: no old worker may join the new run
        service(c, w).process.kill()
    since = log_sizes(c)
    agg_env = {"POWERTRIP_CHECKPOINT_DIR": str(out / "ckpt"), "POWERTRIP_PACE": str(PACE)}
    started = [respawn(c, "aggregator", **agg_env)]
    state = str(out / "worker-state")
    started += [respawn(c, w, POWERTRIP_WORKER_STATE_DIR=state) for w in c.plan.worker_ids]
    for s in started:
        s.wait_ready(120)
    if kill is not None:
        restart_between_rounds(c, *kill, since)
    return finished(c), model_sha256(out / "ckpt")


def finished(c: LocalCluster):
    st = c.wait_done(timeout_s=120)
    assert st.state == aggregator_pb2.RUN_STATE_DONE and st.round == ROUNDS, st.message
    return st


def victim(golden) -> tuple[str, int]:
    """A worker and a round after which to kill it: one of its sites trained by then and
    trained again later, so the kept optimizer state matters to the result."""
    owners = {f"site-{s:03d}": f"worker-{s // (SITES // 2)}" for s in range(SITES)}
    for after in range(1, ROUNDS):
        before = {s for r in golden.rounds[:after] for s in r.selected_site_ids}
        later = {s for r in golden.rounds[after:] for s in r.selected_site_ids}
        if again := sorted(before & later):
            return owners[again[0]], after
    raise AssertionError(f"no site is selected twice: {rounds(golden)}")


@pytest.mark.reliability("R18")
def test_a_worker_killed_between_rounds_resumes_its_optimizer_states_bit_identically(
    tmp_path,
):
    t0 = time.monotonic()
    with LocalCluster(plan(tmp_path / "golden")) as c:
        c.start()  # the uninterrupted run; the profiler stays for the next two
        golden = finished(c)
        golden_sha = model_sha256(tmp_path / "golden" / "ckpt")
        name, after = victim(golden)
        restarted, sha = run(c, tmp_path / "restarted", (name, after, True))
        assert rounds(restarted) == rounds(golden)
        assert sha == golden_sha
        # the control: the same restart without the saved states changes the final model
        control, control_sha = run(c, tmp_path / "control", (name, after, False))
    assert [r[1] for r in rounds(control)] == [r[1] for r in rounds(golden)]  # same sites
    assert control_sha != golden_sha
    print(f"\n{name} killed after round {after}; three runs in {time.monotonic() - t0:.1f} s")
