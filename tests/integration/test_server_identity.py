"""Servers prove who they are (R27): a client names the identity it expects (``aggregator``,
``profiler``, a worker id) and the server's certificate must carry that name, whatever address
was dialled. Any certificate from the cluster's CA used to pass for any peer at 127.0.0.1 (every
certificate carried loopback and the shared host names): a worker registered with a fake
aggregator presenting another worker's certificate. Real services, real sockets, real mTLS."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import grpc
import pytest

from powertrip.services.aggregator.run import AggregatorRun
from powertrip.services.cli.certs import mint_cluster, tls_env
from powertrip.services.common.config import ServiceConfig, load_config
from powertrip.services.common.grpc_client import make_channel, retry_idempotent
from powertrip.services.common.grpc_server import build_server
from powertrip.services.common.identity import AGGREGATOR
from powertrip.services.worker.runner import RoundRunner
from powertrip.services.worker.servicer import WorkerServicer
from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.aggregator_in_process import serve, small_run

pytestmark = pytest.mark.reliability("R27")
ODD_ID = "w_0.eu-west.1"  # worker ids may hold '_' and '.': such a name must verify too


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    mint_cluster(d, ["w0", "w1", ODD_ID])
    return d


def cfg_of(pki: Path, name: str) -> ServiceConfig:
    return load_config(ServiceConfig, tls_env(pki, name))


def serve_aggregator(pki: Path, presenting: str) -> tuple[grpc.Server, str, AggregatorRun]:
    """The real AggregatorService, serving with ``presenting``'s certificate and key."""
    run = small_run(**tls_env(pki, presenting))
    server, port = serve(run)
    return server, f"127.0.0.1:{port}", run


def serve_worker(pki: Path, presenting: str) -> tuple[grpc.Server, str]:
    """The real WorkerService (no sites loaded: it is only pinged) with ``presenting``'s pair."""
    servicer = WorkerServicer(RoundRunner(lambda *a: None), [0])
    server, port, _ = build_server(
        [lambda s: worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, s)],
        "127.0.0.1:0",
        cfg_of(pki, presenting),
        [],
    )
    server.start()
    return server, f"127.0.0.1:{port}"


def register(address: str, pki: Path, worker: str, site: str, worker_address: str = "x:9"):
    """RegisterWorker as a real worker sends it: its own certificate, expecting the aggregator."""
    stub = aggregator_pb2_grpc.AggregatorServiceStub(
        make_channel(address, cfg_of(pki, worker), AGGREGATOR)
    )
    request = aggregator_pb2.RegisterWorkerRequest(
        worker_id=worker, address=worker_address, site_ids=[site]
    )
    return stub.RegisterWorker(request, timeout=5)


def test_a_worker_refuses_an_aggregator_presenting_another_workers_certificate(pki, caplog):
    impostor, fake_address, fake_run = serve_aggregator(pki, presenting="w1")
    genuine, address, run = serve_aggregator(pki, presenting="aggregator")
    attempts = []

    @retry_idempotent(max_seconds=20, max_attempts=10)
    def join_the_impostor() -> None:
        attempts.append(1)
        register(fake_address, pki, "w0", "site-000")

    try:
        started = time.monotonic()
        with caplog.at_level(logging.ERROR), pytest.raises(grpc.RpcError) as exc:
            join_the_impostor()
        elapsed = time.monotonic() - started
        assert exc.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "presents the certificate of 'w1', not 'aggregator'" in exc.value.details()
        assert len(attempts) == 1 and elapsed < 5  # permanent: no retries, said at once
        assert fake_run.registry.site_count == 0  # nothing reached the impostor
        refused = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 1, [r.getMessage() for r in caplog.records]

        register(address, pki, "w0", "site-000")  # the genuine aggregator's certificate works
        assert run.registry.owner(0).worker_id == "w0"
    finally:
        impostor.stop(grace=None)
        genuine.stop(grace=None)


def test_a_certificate_minted_for_w0_cannot_serve_as_w1_to_the_aggregators_executor(pki):
    """The executor dials a worker at the address it registered and expects that worker's id:
    a w0 key behind w1's address is refused; w0 at its own address answers."""
    server, address, run = serve_aggregator(pki, presenting="aggregator")
    w0, w0_address = serve_worker(pki, presenting="w0")
    try:
        register(address, pki, "w0", "site-000", worker_address=w0_address)
        register(address, pki, "w1", "site-001", worker_address=w0_address)  # w0 answers there
        ping = worker_pb2.PingRequest(payload=b"hello")
        assert run.executor._stub("w0").Ping(ping, timeout=5).payload == b"hello"
        with pytest.raises(grpc.RpcError) as exc:
            run.executor._stub("w1").Ping(ping, timeout=5)
        assert exc.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "presents the certificate of 'w0', not 'w1'" in exc.value.details()
    finally:
        w0.stop(grace=None)
        server.stop(grace=None)


def test_a_worker_id_with_underscores_and_dots_verifies_as_a_server_name(pki):
    server, address = serve_worker(pki, presenting=ODD_ID)
    try:
        stub = worker_pb2_grpc.WorkerServiceStub(
            make_channel(address, cfg_of(pki, "aggregator"), ODD_ID)
        )
        assert stub.Ping(worker_pb2.PingRequest(payload=b"x"), timeout=5).payload == b"x"
    finally:
        server.stop(grace=None)


def test_a_tls_channel_must_name_the_server_it_expects(pki):
    with pytest.raises(ValueError, match="needs the identity"):
        make_channel("127.0.0.1:1", cfg_of(pki, "w0"), None)
