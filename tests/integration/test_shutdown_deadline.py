"""SIGTERM ends every service within the grace period it announces, whatever still runs
(reliability matrix R38): an open round waiting on a frozen worker, a stop hook that never
returns, a thread the interpreter would wait for, the interpreter's own teardown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.services.cli.service_process import READY, Service
from powertrip.services.common.grpc_server import DEFAULT_GRACE_S

GRACE_S = 3.0  # the aggregator's POWERTRIP_SHUTDOWN_GRACE_S here: short, so a late exit shows


def exit_after_sigterm(process: subprocess.Popen, limit_s: float) -> tuple[int, float]:
    """(exit code, seconds from SIGTERM to exit); fails if it outlives ``limit_s``."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(limit_s)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"still running {limit_s} s after SIGTERM")
    return code, time.monotonic() - started


def _service(cluster: LocalCluster, name: str) -> Service:
    return next(s for s in cluster.services if s.name == name)


@pytest.mark.slow
@pytest.mark.reliability("R38")
def test_every_service_exits_within_its_announced_grace_under_a_run(tmp_path):
    plan = ClusterPlan(
        insecure=True,
        workers=2,
        sites=4,
        policy="select-all",
        target=0.99,  # unreachable: still training when stopped
        max_rounds=500,
        log_dir=tmp_path / "logs",
        checkpoint_dir=tmp_path / "checkpoints",
        round_deadline_s=120,  # the round would wait this long for the frozen worker
        extra_env={"POWERTRIP_SHUTDOWN_GRACE_S": str(GRACE_S)},
    )
    with LocalCluster(plan) as c:
        c.start()
        while c.status().round < 2:
            time.sleep(0.05)
        frozen = _service(c, "worker-1")
        frozen.process.send_signal(signal.SIGSTOP)  # its sites' updates never come
        try:
            time.sleep(1.0)  # the next round is open, waiting on it
            code, took = exit_after_sigterm(c.aggregator.process, GRACE_S + 10)
            print(f"aggregator: exit {code} {took:.2f} s after SIGTERM (grace {GRACE_S} s)")
            assert code == 0
            assert took <= GRACE_S
            for name in ("worker-0", "profiler"):
                code, took = exit_after_sigterm(_service(c, name).process, DEFAULT_GRACE_S + 10)
                print(f"{name}: exit {code} {took:.2f} s after SIGTERM")
                assert (code, took <= DEFAULT_GRACE_S) == (0, True)
        finally:
            frozen.process.send_signal(signal.SIGCONT)
    log = (plan.log_dir / "aggregator.log").read_text()
    assert f"exit within {GRACE_S:.1f} s" in log and "Traceback" not in log


# A service whose stop hook never returns, with a non-daemon thread that never ends (what a
# stuck gRPC handler is to the interpreter's exit): without a hard deadline it never exits.
STUCK = """
import threading
from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.grpc_server import build_server, exit_process, serve

cfg = ServiceConfig(insecure=True)
server, port, health = build_server([], "127.0.0.1:0", cfg)
server.start()
threading.Thread(target=threading.Event().wait, name="stuck-handler").start()
serve("stuck", server, health, [], f"127.0.0.1:{port}", 0,
      on_stop=lambda _deadline: threading.Event().wait(), grace_s=GRACE,
      exit_code=lambda signalled: 7 if signalled else 8)
exit_process(0)
"""


@pytest.mark.reliability("R38")
def test_the_grace_period_is_a_bound_even_when_the_stop_hangs():
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK.replace("GRACE", str(GRACE_S))],
        env={**os.environ, "POWERTRIP_INSECURE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert READY.search(proc.stdout.readline())
        code, took = exit_after_sigterm(proc, GRACE_S + 10)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read()
    print(f"stuck: exit {code} {took:.2f} s after SIGTERM")
    assert code == 7  # the service's own code for a signalled stop, not a kill's
    assert took <= GRACE_S
    assert f"exiting now, at the end of stuck's {GRACE_S:g} s grace period" in stderr
    assert "stuck-handler" in stderr  # what was still running is named
