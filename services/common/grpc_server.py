"""Server bootstrap: one builder that every service and every servicer test uses."""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.config import ServiceConfig
from services.common.errors import RequestGuard
from services.common.grpc_options import server_options
from services.common.metrics import GrpcMetricsInterceptor
from services.common.tls import server_credentials

#: registers one servicer on a server, e.g. ``lambda s: add_XServicer_to_server(impl, s)``
Registration = Callable[[grpc.Server], None]


def build_server(
    registrations: Sequence[Registration],
    address: str,
    cfg: ServiceConfig,
    service_names: Sequence[str] = (),
    max_workers: int = 16,
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """A started-ready (not started) server bound to ``address``; port 0 picks a free one.

    Returns (server, bound port, health servicer). Health starts NOT_SERVING for every name:
    the service flips it to SERVING once it can do its job (e.g. a checkpoint is loaded).
    With TLS settings in ``cfg`` the port is mutual TLS, otherwise plaintext. Metrics see every
    RPC's final code (outermost); ``RequestGuard`` keeps garbage requests to one log line.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        interceptors=[GrpcMetricsInterceptor(), RequestGuard()],
        options=server_options(cfg),
    )
    for register in registrations:
        register(server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", *service_names):
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    creds = server_credentials(cfg)
    if creds is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, creds)
    if port == 0:
        raise OSError(f"cannot bind gRPC server to {address}")
    return server, port, health_servicer


def set_serving(health_servicer: health.HealthServicer, names: Sequence[str], up: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING if up else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", *names):
        health_servicer.set(name, status)


def serve(
    service: str,
    server: grpc.Server,
    health_servicer: health.HealthServicer,
    names: Sequence[str],
    grpc_addr: str,
    metrics_port: int,
    on_stop: Callable[[], None] = lambda: None,
    grace_s: float = 5.0,
    block: bool = True,
) -> None:
    """Report SERVING, print the READY line launchers parse, and on SIGTERM/SIGINT go
    NOT_SERVING at once, stop the service's own work, then drain the server."""
    set_serving(health_servicer, names, True)
    print(f"READY service={service} grpc={grpc_addr} metrics={metrics_port}", flush=True)

    def shutdown(_signum: int, _frame: object) -> None:
        set_serving(health_servicer, names, False)
        on_stop()
        server.stop(grace=grace_s)

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    if block:
        server.wait_for_termination()
