"""Reliability row R22: keepalive that never trips on itself, and a long idle stream that lives.

Training a site can keep an update stream open and silent for minutes. The client pings to
notice a frozen peer (row R22's SIGSTOP case is in test_service_faults.py); the server must
accept those pings, or it answers GOAWAY "too_many_pings" and the idle stream dies. The shipped
options (services/common/grpc_options.py) are tested here with keepalive scaled down from 10 s
to 0.2 s, so "idle for 3 x keepalive" takes about a second.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.grpc_client import make_channel
from powertrip.services.common.grpc_server import build_server

KEEPALIVE_S = 0.2
IDLE_S = 6 * KEEPALIVE_S  # > 3 keepalive periods, and several pings, of silence
METHOD = "/test.Idle/Count"


def count(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
    """Client streaming: answers how many messages arrived (the stream must survive the gap)."""
    return str(sum(1 for _ in requests)).encode()


def idle_handler() -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "test.Idle",
        {
            "Count": grpc.stream_unary_rpc_method_handler(
                count, request_deserializer=None, response_serializer=None
            )
        },
    )


def slow_messages(n: int, gap_s: float) -> Iterator[bytes]:
    for i in range(n):
        if i:
            time.sleep(gap_s)
        yield b"x"


def shipped_cfg() -> ServiceConfig:
    return ServiceConfig(keepalive_s=KEEPALIVE_S, keepalive_timeout_s=1.0, insecure=True)


def stream_over_idle_gaps(address: str, cfg: ServiceConfig) -> bytes:
    with make_channel(address, cfg) as channel:
        call = channel.stream_unary(METHOD)
        return call(slow_messages(3, IDLE_S), timeout=30)


@pytest.mark.reliability("R22")
def test_an_idle_stream_survives_many_keepalive_periods_with_the_shipped_options():
    cfg = shipped_cfg()
    server, port, _ = build_server(
        [lambda s: s.add_generic_rpc_handlers((idle_handler(),))], "127.0.0.1:0", cfg
    )
    server.start()
    try:
        started = time.monotonic()
        assert stream_over_idle_gaps(f"127.0.0.1:{port}", cfg) == b"3"
        assert time.monotonic() - started >= 2 * IDLE_S
        # the connection is still good for the next call: no GOAWAY was sent
        assert stream_over_idle_gaps(f"127.0.0.1:{port}", cfg) == b"3"
    finally:
        server.stop(grace=None)
