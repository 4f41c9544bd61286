"""Ending well, on real processes: SIGTERM makes every service go NOT_SERVING (observable before
the port closes), finish or abandon its work and exit 0 within its grace period; a FAILED run
(every worker lost) makes the aggregator go NOT_SERVING and exit 4, so an orchestrator restarts
it."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from powertrip.services.aggregator import checkpoint
from powertrip.services.aggregator.__main__ import EXIT_RUN_FAILED
from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.services.cli.service_process import Service
from powertrip.services.common.grpc_server import DEFAULT_GRACE_S

pytestmark = pytest.mark.slow

GRACE_S = 5.0  # the aggregator's POWERTRIP_SHUTDOWN_GRACE_S here
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthWatch:
    """Polls grpc.health.v1 Check in a tight loop from a thread until the port closes."""

    def __init__(self, address: str) -> None:
        self.seen: list[int] = []
        self._channel = grpc.insecure_channel(address)
        self._stub = health_pb2_grpc.HealthStub(self._channel)
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        while not self.seen:  # watching before the signal goes out
            time.sleep(0.01)

    def _poll(self) -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                reply = self._stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=0.5)
            except grpc.RpcError:
                if self.seen:  # the port closed (or the process is gone)
                    return
                continue
            self.seen.append(reply.status)

    def join(self) -> list[int]:
        self._thread.join(10)
        self._channel.close()
        return self.seen


def terminate(service: Service, timeout_s: float) -> tuple[int, float, list[int]]:
    """SIGTERM while watching health: (exit code, seconds to exit, statuses seen)."""
    watch = HealthWatch(service.grpc_addr)
    started = time.monotonic()
    service.process.send_signal(signal.SIGTERM)
    try:
        code = service.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{service.name} still running {timeout_s} s after SIGTERM")
    took, seen = time.monotonic() - started, watch.join()
    print(
        f"{service.name}: exit {code} {took:.2f} s after SIGTERM; health seen {sorted(set(seen))}"
    )
    return code, took, seen


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    out = tmp_path_factory.mktemp("ending")
    plan = ClusterPlan(
        insecure=True,  # the health watch polls in plaintext
        workers=2,
        sites=4,
        policy="select-all",
        target=0.99,  # unreachable: the run is still training when it is stopped
        max_rounds=500,
        log_dir=out / "logs",
        checkpoint_dir=out / "checkpoints",
        round_deadline_s=30,  # longer than the grace: a stop must not wait for it
        extra_env={"POWERTRIP_SHUTDOWN_GRACE_S": str(GRACE_S)},
    )
    with LocalCluster(plan) as c:
        c.start()
        while c.status().round < 2:
            time.sleep(0.05)
        yield c, out


def _service(cluster: LocalCluster, name: str) -> Service:
    return next(s for s in cluster.services if s.name == name)


@pytest.mark.reliability("R23")
def test_a_worker_sigtermed_while_training_exits_0_not_sigabrt(cluster):
    c, _ = cluster
    code, took, seen = terminate(_service(c, "worker-1"), DEFAULT_GRACE_S + 2)
    assert code == 0
    assert took <= DEFAULT_GRACE_S
    assert NOT_SERVING in seen
    log = (c.plan.log_dir / "worker-1.log").read_text()
    assert "Traceback" not in log


@pytest.mark.reliability("R23")
def test_the_profiler_sigtermed_exits_0_after_not_serving(cluster):
    c, _ = cluster
    code, took, seen = terminate(_service(c, "profiler"), DEFAULT_GRACE_S + 2)
    assert (code, NOT_SERVING in seen) == (0, True)
    assert took <= DEFAULT_GRACE_S


@pytest.mark.reliability("R23")
def test_the_aggregator_sigtermed_mid_run_exits_0_with_its_last_round_checkpointed(cluster):
    c, out = cluster
    before = c.status().round
    assert c.status().state == 2  # still training
    code, took, seen = terminate(c.aggregator, GRACE_S + 2)
    assert code == 0
    assert took <= GRACE_S
    assert seen[0] != NOT_SERVING and NOT_SERVING in seen  # SERVING, then NOT_SERVING, closed
    latest = checkpoint.load_latest(out / "checkpoints", lambda _ckpt: None, False)
    assert latest is not None and latest.round >= max(before, 1)
    log = (c.plan.log_dir / "aggregator.log").read_text()
    assert "Traceback" not in log


def test_losing_every_worker_makes_the_aggregator_go_not_serving_and_exit_4(tmp_path):
    plan = ClusterPlan(
        insecure=True,  # the health watch polls in plaintext
        workers=2,
        sites=4,
        policy="select-all",
        target=0.99,
        max_rounds=500,
        log_dir=tmp_path / "logs",
        round_deadline_s=2,
        extra_env={"POWERTRIP_MAX_FAILED_ROUNDS": "2"},
    )
    with LocalCluster(plan) as c:
        c.start()
        while c.status().round < 1:
            time.sleep(0.05)
        agg = c.aggregator
        watch = HealthWatch(agg.grpc_addr)
        for s in c.services:
            if s.name.startswith("worker"):
                s.process.kill()
        code = agg.process.wait(30)
        print(f"aggregator: exit {code} after losing every worker")
        assert code == EXIT_RUN_FAILED
        assert NOT_SERVING in watch.join()
    log = (tmp_path / "logs" / "aggregator.log").read_text()
    assert f"exit {EXIT_RUN_FAILED}: the run failed: 2 rounds in a row without any update" in log
