"""A worker SIGKILLed between rounds and restarted with its state directory
(POWERTRIP_WORKER_STATE_DIR) rejoins the run so that the run ends with the same final model,
bit for bit, as an uninterrupted one, with a stateful local optimizer (AdamW, kept moments).

Between rounds: a pace (POWERTRIP_PACE) holds the aggregator a moment after each round; the
test freezes it (SIGSTOP) in that hold, kills the worker, starts it again on its port, waits
until it has rebuilt its sites from the saved run and resumed their optimizer states, and
thaws the aggregator (SIGCONT): no round is dispatched while the worker is down. The leases
outlast the restart (a long heartbeat patience), so the restarted worker's sites stay in the
selection; it registers as ready at once. The negative control restarts the worker the same
way after deleting its saved optimizer states: its sites start from zero moments and the
final model differs, so the comparison can fail.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from powertrip.v1 import aggregator_pb2
from services.cli.launcher import ClusterPlan, LocalCluster, Service
from services.cli.service_process import start_service
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
        pace=PACE,
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


def restart_between_rounds(c: LocalCluster, name: str, after: int, keep_states: bool) -> None:
    """Freeze the aggregator in its hold after round ``after``, SIGKILL worker ``name`` and
    start it again on its port (its saved optimizer states deleted unless ``keep_states``),
    thaw the aggregator once the worker has rebuilt its sites."""
    agg = c.aggregator.process
    wait_for(lambda: c.status().round >= after, 60, f"round {after}")
    agg.send_signal(signal.SIGSTOP)
    try:
        for w in c.plan.worker_ids:  # frozen in the pace's hold: the next round not sent
            log = service(c, w).log_path
            assert log is not None
            sent = f"StartRound] round={after + 1} " in log.read_text()
            assert not sent, f"the freeze missed the gap after round {after}: machine too slow"
        old = service(c, name)
        old.process.kill()
        old.process.wait()
        c.services.remove(old)
        states = Path(old.env["POWERTRIP_WORKER_STATE_DIR"]) / name / "site-states.pt"
        assert states.exists()
        if not keep_states:
            states.unlink()
        assert old.log_path is not None
        log_from = old.log_path.stat().st_size
        env = {**old.env, "POWERTRIP_GRPC_PORT": old.grpc_addr.rsplit(":", 1)[1]}
        new = start_service(name, "worker", env, c.plan.log_dir)
        c.services.append(new)

        def rebuilt() -> bool:
            assert new.process.poll() is None, "the restarted worker exited"
            with old.log_path.open("rb") as f:
                f.seek(log_from)
                return b"rejoining" in f.read()

        wait_for(rebuilt, 60, "the restarted worker rebuilding its sites")
    finally:
        agg.send_signal(signal.SIGCONT)
    new.wait_ready(60)


def run(out: Path, kill: tuple[str, int, bool] | None = None):
    with LocalCluster(plan(out)) as c:
        c.start()
        if kill is not None:
            restart_between_rounds(c, *kill)
        st = c.wait_done(timeout_s=120)
        assert st.state == aggregator_pb2.RUN_STATE_DONE and st.round == ROUNDS, st.message
        return st, model_sha256(out / "ckpt")


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
    golden, golden_sha = run(tmp_path / "golden")
    name, after = victim(golden)
    restarted, sha = run(tmp_path / "restarted", (name, after, True))
    assert rounds(restarted) == rounds(golden)
    assert sha == golden_sha
    # the control: the same restart without the saved states changes the final model
    control, control_sha = run(tmp_path / "control", (name, after, False))
    assert [r[1] for r in rounds(control)] == [r[1] for r in rounds(golden)]  # same sites
    assert control_sha != golden_sha
    print(f"\n{name} killed after round {after}; three runs in {time.monotonic() - t0:.1f} s")
