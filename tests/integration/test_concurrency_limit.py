"""Reliability row R24: a server at POWERTRIP_MAX_CONCURRENT_RPCS sheds load at once, and the
clients' jittered retry turns that into a short wait, not a failure.

Without the limit, a registration flood queues behind the handler threads without bound; with
it, the excess is answered RESOURCE_EXHAUSTED immediately and retried. An oversized message is
RESOURCE_EXHAUSTED too, but that one is an answer, never retried.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.grpc_client import is_unavailable, make_channel, retry_idempotent
from powertrip.services.common.grpc_server import build_server

LIMIT = 2
CALLS = 8
HOLD_S = 0.3


def slow_echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    time.sleep(HOLD_S)
    return request


@pytest.fixture(scope="module")
def address():
    cfg = ServiceConfig(insecure=True, max_concurrent_rpcs=LIMIT)
    handler = grpc.method_handlers_generic_handler(
        "test.Busy", {"Echo": grpc.unary_unary_rpc_method_handler(slow_echo)}
    )
    server, port, _ = build_server(
        [lambda s: s.add_generic_rpc_handlers((handler,))], "127.0.0.1:0", cfg
    )
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


def flood(address: str, call) -> list[object]:
    cfg = ServiceConfig(insecure=True)
    with ThreadPoolExecutor(CALLS) as pool:
        channels = [make_channel(address, cfg) for _ in range(CALLS)]
        try:
            futures = [
                pool.submit(call, ch.unary_unary("/test.Busy/Echo"), str(i).encode())
                for i, ch in enumerate(channels)
            ]
            return [f.exception() or f.result() for f in futures]
        finally:
            for ch in channels:
                ch.close()


@pytest.mark.reliability("R24")
def test_calls_over_the_limit_are_refused_at_once_as_busy(address):
    started = time.monotonic()
    results = flood(address, lambda echo, body: echo(body, timeout=10))
    busy = [r for r in results if isinstance(r, grpc.RpcError)]
    assert len(busy) >= CALLS - LIMIT - 2  # timing on 2 cores: a call or two may slip in late
    assert all(r.code() is grpc.StatusCode.RESOURCE_EXHAUSTED for r in busy)
    assert all(is_unavailable(r) for r in busy)  # i.e. worth a retry
    assert time.monotonic() - started < CALLS * HOLD_S  # shed, not queued behind each other


@pytest.mark.reliability("R24")
def test_with_the_clients_retry_every_call_succeeds(address):
    @retry_idempotent(max_seconds=30, max_attempts=50)
    def echo(stub, body: bytes) -> bytes:
        return stub(body, timeout=10)

    results = flood(address, echo)
    assert results == [str(i).encode() for i in range(CALLS)]


def test_an_oversized_message_is_resource_exhausted_but_not_retried():
    cfg = ServiceConfig(insecure=True, max_message_mib=1)
    handler = grpc.method_handlers_generic_handler(
        "test.Busy", {"Echo": grpc.unary_unary_rpc_method_handler(lambda r, c: r)}
    )
    server, port, _ = build_server(
        [lambda s: s.add_generic_rpc_handlers((handler,))], "127.0.0.1:0", cfg
    )
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch, pytest.raises(grpc.RpcError) as exc:
            ch.unary_unary("/test.Busy/Echo")(b"x" * (2 << 20), timeout=10)
    finally:
        server.stop(grace=None)
    assert exc.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not is_unavailable(exc.value)
