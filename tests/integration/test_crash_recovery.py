"""The aggregator SIGKILLed in the middle of a fold and in the middle of a checkpoint write, then
restarted: the run resumes from the last committed round and ends with a final model whose
SHA-256 equals an uninterrupted run's, with the same rounds (sites, accuracies, clock).

One cluster (profiler, 2 workers hosting 4 sites) serves both runs: the golden run first, then
the crashed run in its own checkpoint directory, killed three times in round 3 (in a fold, in a
checkpoint write, after a checkpoint commit) before it is let finish. The aggregator kills
itself at the exact moment (``POWERTRIP_FAULT_INJECT``,
``powertrip.services.common.fault_points``), so the crash lands where no outside ``kill``
could aim; the workers stay up and find each new aggregator by their heartbeat. Each
restart's readiness is watched: the port refuses (the server is built only once the checkpoint
is loaded) or answers NOT_SERVING, never SERVING before the log says the checkpoint was loaded.
"""

from __future__ import annotations

import hashlib
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from powertrip.services.aggregator import checkpoint
from powertrip.services.cli.certs import tls_env
from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.services.common.config import ServiceConfig, load_config
from powertrip.services.common.grpc_client import make_channel
from powertrip.v1 import aggregator_pb2

pytestmark = pytest.mark.slow

ROUNDS = 5
CRASH_ROUND = 3
SITES = 4


def model_sha256(directory: Path) -> str:
    """SHA-256 of the newest checkpoint's model: every tensor in name order (name, dtype,
    shape, bytes); the npz file itself carries zip timestamps, so it is not hashed whole."""
    ckpt = checkpoint.load_latest(directory)
    assert ckpt is not None, f"no checkpoint in {directory}"
    h = hashlib.sha256()
    for name in sorted(ckpt.params):
        a = ckpt.params[name]
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes(order="C"))
    return h.hexdigest()


def rounds(status: aggregator_pb2.GetStatusResponse) -> list[tuple]:
    return [
        (r.round, list(r.selected_site_ids), r.accuracy, r.loss, r.clock_seconds, r.outcome)
        for r in status.rounds
    ]


@dataclass
class Bench:
    cluster: LocalCluster
    out: Path
    golden_status: aggregator_pb2.GetStatusResponse
    golden_sha: str
    final: aggregator_pb2.GetStatusResponse | None = None
    # (restart to SERVING, restart to every site registered again) of each resume, seconds
    timings: list[tuple[float, float]] = field(default_factory=list)

    @property
    def log(self) -> Path:
        path = self.cluster.aggregator.log_path
        assert path is not None
        return path


def crash_plan(out: Path, **env: str) -> ClusterPlan:
    """The crash tests' cluster: two workers, the emulated clock, ``ROUNDS`` rounds, mTLS,
    checkpoints in ``out/golden``; ``env``: more aggregator settings."""
    return ClusterPlan(
        workers=2,
        sites=SITES,
        policy="powertrip",
        clock="emulated",
        preset="quick",
        num_samples=2000,  # small sites: short rounds
        target=0.99,  # unreachable: every run goes through its whole round budget
        max_rounds=ROUNDS,
        seed=0,
        round_deadline_s=10,
        log_dir=out / "logs",
        checkpoint_dir=out / "golden",
        extra_env={"POWERTRIP_HEARTBEAT_S": "0.5", **env},
        tls_dir=out / "tls",  # mTLS, as deployed
    )


def golden_run(out: Path, plan: ClusterPlan) -> Iterator[Bench]:
    """The uninterrupted run every crash is compared with; the cluster stays up for restarts."""
    with LocalCluster(plan) as cluster:
        cluster.start()
        golden = cluster.wait_done(timeout_s=120)
        assert golden.state == aggregator_pb2.RUN_STATE_DONE and golden.round == ROUNDS
        yield Bench(cluster, out, golden, model_sha256(out / "golden"))


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("crash")
    for b in golden_run(out, crash_plan(out)):
        yield b
    for serving, back in b.timings:
        print(f"\nresume: restart to SERVING {serving:.2f} s, to every site back {back:.2f} s")


def operator_channel(b: Bench, address: str) -> grpc.Channel:
    tls_dir = b.cluster.plan.tls_dir
    assert tls_dir is not None
    cfg = load_config(ServiceConfig, tls_env(tls_dir, "operator"))
    return make_channel(address, cfg, "aggregator")


def watch_readiness(b: Bench, log_from: int, seen: dict) -> threading.Thread:
    """Poll the health service until SERVING; record when, what was answered before, and
    whether the log already said the checkpoint was loaded at that moment."""

    address, log = b.cluster.aggregator.grpc_addr, b.log  # the restart keeps the port

    def check() -> str:
        # A fresh channel per refused attempt: one channel would back off up to 3 s between
        # connection attempts, long enough on a slow machine to miss an armed aggregator's
        # whole SERVING window (it dies two rounds after it starts).
        with operator_channel(b, address) as ch:
            try:
                reply = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=0.5
                )
                return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.RpcError as exc:
                return exc.code().name

    def poll() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            answer = check()
            if answer == "SERVING":
                seen["serving_at"] = time.monotonic()
                with log.open("rb") as f:
                    f.seek(log_from)
                    seen["log_then"] = f.read().decode(errors="replace")
                return
            seen.setdefault("before", set()).add(answer)
            time.sleep(0.01)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return thread


@dataclass
class Start:
    log: str  # what this aggregator process logged
    left_behind: list[str]  # the checkpoint directory when it died (armed) or ended


def start_aggregator(b: Bench, ckpts: Path, armed: str | None) -> Start:
    """Start the aggregator again on its port (killing the one there), with ``ckpts`` and a
    crash point ``armed`` (None: none); an armed one must die by SIGKILL, an unarmed one must
    finish the run. Readiness is watched from the start: refused or NOT_SERVING until the
    checkpoint is loaded, SERVING after."""
    env = b.cluster.aggregator.env
    env["POWERTRIP_CHECKPOINT_DIR"] = str(ckpts)
    env.pop("POWERTRIP_FAULT_INJECT", None)
    if armed:
        env["POWERTRIP_FAULT_INJECT"] = armed
    old = b.cluster.aggregator.process
    if old.poll() is None:  # the golden run's, still SERVING: gone before readiness is watched
        old.kill()
        old.wait()
    log_from, seen = b.log.stat().st_size, {}
    t0 = time.monotonic()
    watcher = watch_readiness(b, log_from, seen)
    b.cluster.restart("aggregator")
    watcher.join(timeout=60)
    assert "serving_at" in seen, "never SERVING"
    assert seen.get("before", set()) <= {"UNAVAILABLE", "NOT_SERVING", "DEADLINE_EXCEEDED"}, seen
    resuming = ckpts.exists() and any(ckpts.glob("round-*.json"))
    assert not resuming or "resuming after round" in seen["log_then"], "SERVING before loading"
    while not sites_back(b, armed):
        assert time.monotonic() - t0 < 30, "the workers did not come back"
        time.sleep(0.02)
    if resuming:
        b.timings.append((seen["serving_at"] - t0, time.monotonic() - t0))
    if armed:
        assert b.cluster.aggregator.process.wait(timeout=60) == -signal.SIGKILL, armed
    else:
        b.final = b.cluster.wait_done(timeout_s=60)
    with b.log.open("rb") as f:
        f.seek(log_from)
        log = f.read().decode(errors="replace")
    return Start(log, sorted(p.name for p in ckpts.iterdir()))


def sites_back(b: Bench, armed: str | None) -> bool:
    """Every site registered again; or, for an armed aggregator already dead by its own hand
    (a point that fires as soon as the sites are back), True: it saw them back to get there."""
    try:
        return b.cluster.status().registered_sites >= SITES
    except grpc.RpcError:
        if armed and b.cluster.aggregator.process.poll() is not None:
            return True
        raise


def files(*rounds: int) -> list[str]:
    """The checkpoints of ``rounds`` and the journal file beside them."""
    return ["journal.jsonl", *(f"round-{r:06d}.{ext}" for r in rounds for ext in ("json", "npz"))]


def journal_lines(ckpts: Path) -> int:
    return len((ckpts / "journal.jsonl").read_bytes().splitlines())


@pytest.mark.reliability("R6", "R7")
def test_killed_in_a_fold_in_a_checkpoint_write_and_after_a_commit_the_run_ends_bit_identical(
    bench,
):
    """Six kill points, with the default robust aggregation: round 3 is crashed three times over
    (in a fold, in its checkpoint's write, after its commit), round 4 three more (in flight on
    a worker, built but not recorded, and at the resume itself), each restart resuming from
    what was committed; the run ends on the uninterrupted run's model, bit for bit."""
    assert len(bench.golden_status.rounds[CRASH_ROUND - 1].selected_site_ids) > 1  # a fold to cut
    ckpts = bench.out / "crashed"

    # (a) after the first of round 3's updates was folded: nothing of round 3 on disk
    first = start_aggregator(bench, ckpts, f"aggregation@{CRASH_ROUND}")
    assert first.left_behind == files(1, 2)
    assert journal_lines(ckpts) == 2

    # (b) resumed from round 2, killed with round 3's model in place and its manifest
    # written but not renamed: round 3 is not committed
    second = start_aggregator(bench, ckpts, f"checkpoint-write@{CRASH_ROUND}")
    assert "resuming after round 2" in second.log
    assert second.left_behind == sorted([*files(1, 2), "round-000003.npz", "round-000003.json.tmp"])
    assert journal_lines(ckpts) == 3  # round 3 appended, past round 2's committed prefix

    # (c) resumed from round 2 again (the leftover removed), killed after round 3's manifest
    # was renamed into place, before the directory fsync and the prune
    third = start_aggregator(bench, ckpts, f"checkpoint-commit@{CRASH_ROUND}")
    assert "resuming after round 2" in third.log and "removed round-000003.json.tmp" in third.log
    assert third.left_behind == files(1, 2, 3)
    assert journal_lines(ckpts) == 3  # the uncommitted line cut off and round 3 appended anew

    # (d) resumed from round 3, killed once a worker holds round 4's model and trains it
    fourth = start_aggregator(bench, ckpts, f"broadcast@{CRASH_ROUND + 1}")
    assert "resuming after round 3" in fourth.log
    # (e) again, killed with round 4's new model built and evaluated, not yet recorded
    fifth = start_aggregator(bench, ckpts, f"evaluation@{CRASH_ROUND + 1}")
    assert "resuming after round 3" in fifth.log
    # (f) again, killed the moment round 3's checkpoint is restored (a crash loop at resume)
    sixth = start_aggregator(bench, ckpts, f"resumed@{CRASH_ROUND + 1}")
    assert "resuming after round 3" in sixth.log
    assert all(f in sixth.left_behind for f in files(2, 3))  # none of them cost a checkpoint

    # resumed from round 3, to the end: the same rounds and the same model, bit for bit
    last = start_aggregator(bench, ckpts, None)
    assert "resuming after round 3" in last.log
    assert bench.final.state == aggregator_pb2.RUN_STATE_DONE, bench.final.message
    assert rounds(bench.final) == rounds(bench.golden_status)
    assert model_sha256(ckpts) == bench.golden_sha
    # with the default (robust) aggregation on: its bound went through every restart
    final = checkpoint.load_latest(ckpts)
    assert final is not None and set(final.state["components"]["aggregation"]) == {
        "clip",
        "zeroing",
    }
    # no garbage from the crashes; the run's final model beside its checkpoints
    final_model = ["model.json", "model.safetensors"]
    assert last.left_behind == sorted([*files(ROUNDS - 1, ROUNDS), *final_model])
    assert journal_lines(ckpts) == ROUNDS
