"""Sites bound to identities over real mTLS (R28): with POWERTRIP_SITE_OWNERS a worker may claim
only the sites assigned to its certificate's name, whoever registers first; a service identity
(operator, aggregator, profiler) never hosts a site; a refused worker process waits, NOT_SERVING,
logging the refusal once, instead of exiting into a restart loop, and joins when the way clears.
Aggregators run in-process on real sockets; workers are real ``powertrip-worker`` processes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY

from powertrip.services.aggregator.run import AggregatorRun
from powertrip.services.cli.certs import mint_cluster, tls_env
from powertrip.services.common.config import ServiceConfig, load_config
from powertrip.services.common.grpc_client import make_channel
from powertrip.services.common.identity import AGGREGATOR
from powertrip.services.worker.sites_host import SiteUpdate
from powertrip.services.worker.uploader import update_messages
from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc
from tests.aggregator_in_process import serve, small_run

C = grpc.StatusCode
REPO = Path(__file__).resolve().parents[2]
OWNERS = "w0=0-1;w1=2-3"
pytestmark = pytest.mark.reliability("R28")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    mint_cluster(d, ["w0", "w1", "w9"])
    return d


def start_aggregator(pki: Path, **env: str) -> tuple[grpc.Server, str, AggregatorRun]:
    """A TLS aggregator of 4 sites, lease 1.5 s; ``env``: more POWERTRIP_* settings."""
    run = small_run(POWERTRIP_HEARTBEAT_S="0.25", **{**tls_env(pki, "aggregator"), **env})
    server, port = serve(run)
    return server, f"127.0.0.1:{port}", run


@pytest.fixture
def bound(pki) -> Iterator[tuple[str, AggregatorRun]]:
    server, address, run = start_aggregator(pki, POWERTRIP_SITE_OWNERS=OWNERS)
    yield address, run
    server.stop(grace=None)


def as_cert(address: str, pki: Path, name: str) -> aggregator_pb2_grpc.AggregatorServiceStub:
    channel = make_channel(address, load_config(ServiceConfig, tls_env(pki, name)), AGGREGATOR)
    return aggregator_pb2_grpc.AggregatorServiceStub(channel)


def register(stub, worker_id: str, sites: list[str]) -> aggregator_pb2.RegisterWorkerResponse:
    request = aggregator_pb2.RegisterWorkerRequest(
        worker_id=worker_id, address="127.0.0.1:9", site_ids=sites
    )
    return stub.RegisterWorker(request, timeout=5)


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as exc:
        call()
    return exc.value.code(), exc.value.details()


def denied(method: str, reason: str) -> float:
    labels = {"service": "AggregatorService", "method": method, "reason": reason}
    return REGISTRY.get_sample_value("powertrip_auth_denied_total", labels) or 0.0


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


class Worker:
    """A ``powertrip-worker`` process and its log (stderr), read as it is written."""

    def __init__(self, pki: Path, aggregator: str, worker_id: str, sites: str) -> None:
        self.proc = start_worker(pki, aggregator, worker_id, sites)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.lines.append(line)

    def refusals(self) -> list[str]:
        return [line for line in self.lines if "refused by the aggregator" in line]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> str:
        """End it; its whole log."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)
        return "".join(self.lines)


def start_worker(pki: Path, aggregator: str, worker_id: str, sites: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POWERTRIP_")}
    env |= {
        "POWERTRIP_AGGREGATOR_ADDR": aggregator,
        "POWERTRIP_WORKER_ID": worker_id,
        "POWERTRIP_SITES": sites,
        "POWERTRIP_BIND_HOST": "127.0.0.1",
        "POWERTRIP_ADVERTISE_HOST": "127.0.0.1",
        "POWERTRIP_GRPC_PORT": "0",
        "POWERTRIP_METRICS_PORT": "0",
        "POWERTRIP_HEARTBEAT_S": "0.2",  # it retries a refused registration this often
        "POWERTRIP_DEVICE": "cpu",
        **tls_env(pki, worker_id),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "powertrip.services.worker"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# -- the owners map decides, not the order of arrival ---------------------------------------


def test_a_worker_claiming_another_workers_sites_first_is_refused_and_the_owner_joins(bound, pki):
    address, run = bound
    w0, w1 = as_cert(address, pki, "w0"), as_cert(address, pki, "w1")
    n = denied("RegisterWorker", "site_not_assigned")
    code, details = refusal(lambda: register(w1, "w1", ["site-000", "site-002"]))
    assert code == C.PERMISSION_DENIED
    assert details == "worker 'w1' may not host site-000: assigned to 'w0'"
    assert denied("RegisterWorker", "site_not_assigned") == n + 1
    assert run.registry.owner(0) is None and run.registry.owner(2) is None  # nothing registered
    assert register(w0, "w0", ["site-000", "site-001"]).run_seed == run.run_seed
    assert register(w1, "w1", ["site-002", "site-003"]).run_seed == run.run_seed
    code, _ = refusal(lambda: register(w1, "w1", ["site-001", "site-002", "site-003"]))
    assert code == C.PERMISSION_DENIED
    assert [run.registry.owner(s).worker_id for s in range(4)] == ["w0", "w0", "w1", "w1"]


def test_a_certificate_off_the_map_may_host_nothing(bound, pki):
    address, run = bound
    w9 = as_cert(address, pki, "w9")  # a valid certificate from the CA, named on no entry
    code, details = refusal(lambda: register(w9, "w9", ["site-001"]))
    assert code == C.PERMISSION_DENIED
    assert details == "worker 'w9' may not host site-001: assigned to 'w0'"
    assert run.registry.owner(1) is None


def test_the_operator_certificate_cannot_register_or_submit_as_a_worker(pki):
    server, address, run = start_aggregator(pki)  # first-come: nothing else would stop it
    try:
        operator = as_cert(address, pki, "operator")
        n = denied("RegisterWorker", "wrong_role")
        code, details = refusal(lambda: register(operator, "operator", ["site-003"]))
        assert (code, details) == (C.PERMISSION_DENIED, "the operator identity cannot host sites")
        assert denied("RegisterWorker", "wrong_role") == n + 1
        assert run.registry.owner(3) is None
        params = run.executor.params
        update = SiteUpdate(
            3, {k: np.zeros(v.shape, v.dtype) for k, v in params.items()}, 10.0, 0.1
        )
        n = denied("SubmitUpdate", "wrong_role")
        code, details = refusal(
            lambda: operator.SubmitUpdate(update_messages("operator", 0, update, 4096), timeout=5)
        )
        assert code == C.PERMISSION_DENIED and "operator identity" in details
        assert denied("SubmitUpdate", "wrong_role") == n + 1
        # nor may a worker certificate claim a service's name
        code, details = refusal(lambda: register(as_cert(address, pki, "w0"), "aggregator", []))
        assert (code, details) == (C.PERMISSION_DENIED, "the aggregator identity cannot host sites")
    finally:
        server.stop(grace=None)


def test_tls_without_an_owners_map_warns_once_that_sites_are_first_come(pki, caplog):
    caplog.set_level(logging.WARNING, logger="powertrip.services.aggregator.servicer")
    for owners in ({}, {"POWERTRIP_SITE_OWNERS": OWNERS}):
        server, _, _ = start_aggregator(pki, **owners)
        server.stop(grace=None)
    warnings = [r for r in caplog.records if "sites are first-come" in r.getMessage()]
    assert len(warnings) == 1 and "set POWERTRIP_SITE_OWNERS" in warnings[0].getMessage()


def test_the_owners_file_moves_a_site_to_its_new_owner_without_a_restart(pki, tmp_path):
    path = tmp_path / "owners.txt"
    path.write_text("# worker: sites\nw0: 0-1\nw1: 2-3\n")
    server, address, run = start_aggregator(pki, POWERTRIP_SITE_OWNERS_FILE=str(path))
    try:
        w0, w1 = as_cert(address, pki, "w0"), as_cert(address, pki, "w1")
        register(w0, "w0", ["site-000", "site-001"])
        path.write_text("w0: 0\nw1: 1-3\n")
        wait_for(
            lambda: _admitted(lambda: register(w1, "w1", ["site-001", "site-002"])),
            3.0,
            "w1 admitted to site-001 after the file gave it",
        )
        assert run.registry.owner(1).worker_id == "w1"  # taken from w0, which held it
        code, details = refusal(lambda: register(w0, "w0", ["site-000", "site-001"]))
        assert code == C.PERMISSION_DENIED and details.endswith("site-001: assigned to 'w1'")
        assert register(w0, "w0", ["site-000"])  # its remaining site is still its own
    finally:
        server.stop(grace=None)


def _admitted(call: Callable[[], object]) -> bool:
    try:
        call()
    except grpc.RpcError as exc:
        assert exc.code() == C.PERMISSION_DENIED, exc
        return False
    return True


# -- a refused worker waits instead of crash-looping -----------------------------------------


def test_a_refused_worker_process_keeps_running_and_logs_the_refusal_once(bound, pki):
    address, run = bound
    n = denied("RegisterWorker", "site_not_assigned")
    squatter = Worker(pki, address, "w1", "0-1")  # w0's sites, with w1's certificate
    try:
        wait_for(
            lambda: denied("RegisterWorker", "site_not_assigned") >= n + 5,
            60,
            "five refused attempts",
        )
        assert squatter.alive(), "the refused worker exited"
        assert run.registry.owner(0) is None
        w0 = as_cert(address, pki, "w0")
        assert register(w0, "w0", ["site-000", "site-001"]).run_seed == run.run_seed
        time.sleep(1.0)  # more refused retries while the owner is registered
        assert squatter.alive()
        assert [run.registry.owner(s).worker_id for s in (0, 1)] == ["w0", "w0"]
    finally:
        log = squatter.stop()
    lines = squatter.refusals()
    assert len(lines) == 1, log[-3000:]
    assert "worker 'w1' may not host site-000..site-001: assigned to 'w0'" in lines[0]
    assert "cannot join" not in log and "Traceback" not in log


def test_a_worker_refused_a_squatted_site_joins_once_the_squatter_is_gone(pki):
    server, address, run = start_aggregator(pki)  # first-come
    squatting = threading.Event()
    squatting.set()

    def squat() -> None:  # w1 holds site-000 with heartbeats, until told to go
        stub = as_cert(address, pki, "w1")
        while squatting.is_set():
            register(stub, "w1", ["site-000"])
            time.sleep(0.1)

    squatter = threading.Thread(target=squat, daemon=True)
    squatter.start()
    worker = None
    try:
        wait_for(lambda: run.registry.owner(0) is not None, 10, "the squatter registered")
        worker = Worker(pki, address, "w0", "0-1")
        wait_for(lambda: bool(worker.refusals()), 60, "w0 refused")
        time.sleep(1.0)  # refused again and again (ALREADY_EXISTS) while w1 beats
        assert worker.alive(), "the refused worker exited"
        assert run.registry.owner(0).worker_id == "w1"
        squatting.clear()  # the squatter goes away: its 1.5 s lease runs out
        wait_for(lambda: run.registry.owner(0).worker_id == "w0", 10, "w0 took its site")
        assert worker.alive()
    finally:
        squatting.clear()
        squatter.join(timeout=10)
        server.stop(grace=None)
        log = worker.stop() if worker is not None else ""
    lines = worker.refusals()
    assert len(lines) == 1 and "ALREADY_EXISTS" in lines[0], log[-3000:]
    assert "site-000 is already hosted by worker 'w1'" in lines[0]


# -- a bad map stops the aggregator at start ---------------------------------------------------


def test_a_bad_owners_map_stops_the_aggregator_with_exit_2_naming_the_entry():
    env = {k: v for k, v in os.environ.items() if not k.startswith("POWERTRIP_")}
    env |= {
        "POWERTRIP_INSECURE": "1",
        "POWERTRIP_PROFILER_ADDR": "127.0.0.1:1",
        "POWERTRIP_NUM_SITES": "8",
        "POWERTRIP_GRPC_PORT": "0",
        "POWERTRIP_METRICS_PORT": "0",
        "POWERTRIP_SITE_OWNERS": "w0=0-3;w1=3-7",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "powertrip.services.aggregator"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2
    assert err.strip().splitlines() == [
        "powertrip-aggregator: POWERTRIP_SITE_OWNERS entry 'w1=3-7': site-003 already "
        "assigned to 'w0'"
    ]
