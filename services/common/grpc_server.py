"""Server bootstrap: one builder that every service and every servicer test uses."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.errors import RequestGuard
from powertrip.services.common.grpc_options import server_options
from powertrip.services.common.metrics import GrpcMetricsInterceptor
from powertrip.services.common.tls import server_credentials

logger = logging.getLogger(__name__)

#: seconds from SIGTERM to exit unless a service says otherwise; below Kubernetes' default
#: terminationGracePeriodSeconds (30 s), so the orchestrator never needs its SIGKILL
DEFAULT_GRACE_S = 10.0
#: how long NOT_SERVING is observable, at least, before the port closes (capped by the grace)
DRAIN_S = 1.0
#: kept at the end of the grace period for the exit itself (flush, os._exit, the kernel's
#: reaping) and the signal's delivery
EXIT_S = 0.5

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
    With TLS settings in ``cfg`` the port is mutual TLS, otherwise (POWERTRIP_INSECURE=1)
    plaintext, with a loud warning. ``cfg.health_port`` adds a plaintext port serving only the
    same health servicer (``HealthPort``). Metrics see every RPC's final code (outermost);
    ``RequestGuard`` keeps garbage requests to one log line.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        interceptors=[GrpcMetricsInterceptor(), RequestGuard()],
        options=server_options(cfg),
        maximum_concurrent_rpcs=cfg.max_concurrent_rpcs or None,
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
    if cfg.health_port:
        host = address.rsplit(":", 1)[0]
        server = HealthPort(server, health_servicer, f"{host}:{cfg.health_port}")
    if creds is None:
        logger.warning(
            "PLAINTEXT gRPC on :%d (POWERTRIP_INSECURE=1) — any caller that can reach it can "
            "register as any worker, submit updates, start rounds and read the run: no "
            "identity is checked. Use mutual TLS (`powertrip certs`, POWERTRIP_TLS_*) outside "
            "a trusted test network.",
            port,
        )
    return server, port, health_servicer


def start_server(
    register: Registration, cfg: ServiceConfig, service: str
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """A service's one server: ``build_server`` for its servicer ``register`` and its health
    name ``service``, on the configured ``bind_host:grpc_port``, started (NOT_SERVING until
    ``serve``). Returns (server, bound port, health servicer)."""
    server, port, health_servicer = build_server(
        [register], f"{cfg.bind_host}:{cfg.grpc_port}", cfg, [service]
    )
    server.start()
    return server, port, health_servicer


class HealthPort(grpc.Server):
    """The main server plus a plaintext one serving ONLY grpc.health.v1.Health.

    Kubernetes' gRPC probe and compose healthchecks cannot present a client certificate; this
    port answers them without opening any data method to plaintext callers. Both servers share
    one HealthServicer, so NOT_SERVING (startup, drain) shows on both at once. Starting and
    stopping the main server starts and stops this one; everything else is the main server's.
    """

    def __init__(self, main: grpc.Server, servicer: health.HealthServicer, address: str) -> None:
        self.main = main
        self.health_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        health_pb2_grpc.add_HealthServicer_to_server(servicer, self.health_server)
        self.health_port = self.health_server.add_insecure_port(address)
        if self.health_port == 0:
            raise OSError(f"cannot bind the health port {address}")
        logger.info("plaintext health-only port on :%d", self.health_port)

    def start(self) -> None:
        self.main.start()
        self.health_server.start()

    def stop(self, grace: float | None) -> threading.Event:
        self.health_server.stop(grace)
        return self.main.stop(grace)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self.main.wait_for_termination(timeout)

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Any) -> None:
        self.main.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: Any) -> None:
        self.main.add_registered_method_handlers(service_name, method_handlers)

    def add_insecure_port(self, address: str) -> int:
        return self.main.add_insecure_port(address)

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        return self.main.add_secure_port(address, server_credentials)


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
    on_stop: Callable[[float], None] = lambda _deadline: None,
    grace_s: float = DEFAULT_GRACE_S,
    wake: threading.Event | None = None,
    exit_code: Callable[[bool], int] = lambda _signalled: 0,
) -> bool:
    """Report SERVING, print the READY line launchers parse, then block until SIGTERM/SIGINT
    (or until the service sets ``wake`` itself, e.g. its run ended).

    Then, all within ``grace_s``: NOT_SERVING at once and for good, ``on_stop(deadline)`` (the
    service winds its work down by that ``time.monotonic()`` deadline, the port still open so
    in-flight work can finish), NOT_SERVING observable for at least ``min(1 s, grace_s)``, then
    the server drains and stops. True when a signal ended it, False when ``wake`` did; the
    service then ends the process with ``exit_process``. Whatever still runs when the grace
    period ends (a handler, a checkpoint being written, the interpreter's own teardown), the
    process exits then with ``exit_code(signalled)``: the announced figure is a bound.
    """
    wake = wake or threading.Event()
    signalled: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        signalled.append(signum)  # only flags: the main thread does the stopping below
        wake.set()

    # before READY: a launcher may send SIGTERM the moment it reads the line, and a signal
    # that came before the handler would end the process without its graceful stop
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    set_serving(health_servicer, names, True)
    print(f"READY service={service} grpc={grpc_addr} metrics={metrics_port}", flush=True)
    while not wake.wait(0.5):
        pass
    t0 = time.monotonic()
    health_servicer.enter_graceful_shutdown()  # NOT_SERVING for every name; later sets ignored
    why = signal.Signals(signalled[0]).name if signalled else "its work ended"
    logger.info("%s stopping (%s): NOT_SERVING, exit within %.1f s", service, why, grace_s)
    end = t0 + grace_s - min(EXIT_S, grace_s / 8)  # the exit itself, and the signal's delivery
    exit_by(end, lambda: exit_code(bool(signalled)), f"{service}'s {grace_s:g} s grace period")
    reserve = min(1.0, grace_s / 4)  # for the server's own drain
    on_stop(end - reserve)
    left = t0 + min(DRAIN_S, grace_s) - time.monotonic()
    if left > 0:  # let probes see NOT_SERVING before the port closes
        time.sleep(left)
    server.stop(grace=max(0.1, min(reserve, end - time.monotonic()))).wait(
        max(0.0, end - time.monotonic())
    )
    logger.info("%s stopped %.1f s after it began stopping", service, time.monotonic() - t0)
    return bool(signalled)


def exit_by(deadline: float, code: Callable[[], int], what: str) -> threading.Thread:
    """End the process at ``deadline`` (``time.monotonic()``) with ``code()`` if it is still
    running then, from a daemon thread (so nothing the main thread waits on can hold it)."""

    def watch() -> None:
        time.sleep(max(0.0, deadline - time.monotonic()))
        others = (t for t in threading.enumerate() if t is not threading.current_thread())
        busy = sorted({t.name.rstrip("0123456789_-") for t in others})  # kinds, not each pool
        logger.warning("exiting now, at the end of %s; still running: %s", what, ", ".join(busy))
        exit_process(code())

    thread = threading.Thread(target=watch, name="exit-deadline", daemon=True)
    thread.start()
    return thread


def exit_process(code: int) -> NoReturn:
    """End the process now, its output flushed. A service's last step after ``serve``: the
    interpreter's teardown (joining gRPC's handler threads, freeing torch's and numpy's
    modules) takes seconds on a loaded machine, past any grace period, and does nothing a
    service needs (checkpoints are fsynced when written; the kernel closes sockets and files)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
