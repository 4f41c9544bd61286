"""Prometheus plumbing shared by the services: the /metrics endpoint and gRPC server metrics.

The gRPC series keep their conventional unprefixed names (``grpc_server_handled_total``,
``grpc_server_handling_seconds``) so existing dashboards and queries work unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from prometheus_client import Counter, Histogram, start_http_server

from powertrip.services.common.auth_metrics import note_call
from powertrip.services.common.handlers import HandlerInterceptor, wrap_handler

# Both the worker (bytes it sends) and the aggregator (bytes it accepts) count updates; one
# definition lets them share a process (tests, a single-process deployment).
UPDATE_BYTES = Counter(
    "powertrip_update_bytes_total", "Update bytes per site and direction.", ["site", "direction"]
)
GRPC_HANDLED = Counter(
    "grpc_server_handled_total",
    "RPCs completed on the server, by status code.",
    ["grpc_service", "grpc_method", "grpc_code"],
)
GRPC_HANDLING = Histogram(
    "grpc_server_handling_seconds",
    "Time from the start of an RPC to its status.",
    ["grpc_service", "grpc_method"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 120),
)


def start_metrics_server(port: int, addr: str = "127.0.0.1") -> int:
    """Serve /metrics on ``addr``:``port`` (0 = any free port) and return the bound port;
    loopback unless told otherwise (POWERTRIP_METRICS_ADDR): it has no authentication."""
    server, _thread = start_http_server(port, addr=addr)
    return int(server.server_port)


def _code(context: grpc.ServicerContext, failed: bool) -> str:
    code = context.code()
    if code is None:
        return "UNKNOWN" if failed else "OK"
    return code.name


class GrpcMetricsInterceptor(HandlerInterceptor):
    """Counts and times every RPC, including streaming ones, by service, method and code; and
    counts each authenticated TLS connection once (``auth_metrics.note_call``)."""

    def wrap(
        self, handler: grpc.RpcMethodHandler, service: str, method: str
    ) -> grpc.RpcMethodHandler:

        def observe(context: grpc.ServicerContext, start: float, failed: bool) -> None:
            GRPC_HANDLED.labels(service, method, _code(context, failed)).inc()
            GRPC_HANDLING.labels(service, method).observe(time.perf_counter() - start)

        def wrap_unary_response(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
                start = time.perf_counter()
                note_call(context)
                failed = True
                try:
                    response = behavior(request, context)
                    failed = False
                    return response
                finally:
                    observe(context, start, failed)

            return wrapped

        def wrap_stream_response(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                start = time.perf_counter()
                note_call(context)
                failed = True
                try:
                    yield from behavior(request, context)
                    failed = False
                finally:
                    observe(context, start, failed)

            return wrapped

        return wrap_handler(handler, wrap_unary_response, wrap_stream_response)
