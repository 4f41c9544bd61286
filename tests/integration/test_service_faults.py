"""Faults a service must survive (an oversized message, garbage protobuf bytes, SIGTERM, a
frozen peer), and the command line that a service answers before it serves anything."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from powertrip.services.cli.service_process import READY, service_executable
from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.grpc_client import make_channel
from powertrip.v1 import profiler_pb2, profiler_pb2_grpc


def serving(channel: grpc.Channel) -> bool:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def start_profiler(**env_extra: str) -> tuple[subprocess.Popen, str]:
    """A real profiler process (any service will do: they share the server builder)."""
    env = {
        **os.environ,
        "POWERTRIP_BIND_HOST": "127.0.0.1",
        "POWERTRIP_GRPC_PORT": "0",
        "POWERTRIP_METRICS_PORT": "0",
        "POWERTRIP_NUM_SITES": "4",
        **env_extra,
    }
    proc = subprocess.Popen(
        [service_executable("profiler")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()
    match = READY.search(line)
    assert match, f"profiler did not start: {line!r}"
    return proc, match.group(2)


@pytest.fixture(scope="module")
def profiler():
    proc, addr = start_profiler()
    yield proc, addr
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.reliability("R8")
def test_an_oversized_message_is_refused_and_the_server_keeps_serving(profiler):
    _, addr = profiler
    with grpc.insecure_channel(addr) as ch:
        stub = profiler_pb2_grpc.ProfilerServiceStub(ch)
        big = profiler_pb2.MeasureLinksRequest(worker_ids=["x" * 1000] * 6000)  # ~6 MB > 4 MiB
        with pytest.raises(grpc.RpcError) as exc:
            stub.MeasureLinks(big, timeout=5)
        assert exc.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert serving(ch)


@pytest.mark.reliability("R10")
def test_garbage_bytes_fail_before_any_handler_and_the_server_keeps_serving(profiler):
    _, addr = profiler
    with grpc.insecure_channel(addr) as ch:
        raw = ch.unary_unary(
            "/powertrip.v1.ProfilerService/GetSiteProfiles",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        for garbage in (b"\xff" * 7, b"\x0a\xff\xff\xff\xff\x0f", os.urandom(64)):
            try:
                raw(garbage, timeout=5)
            except grpc.RpcError as exc:
                assert exc.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
        assert serving(ch)


def test_sigterm_stops_a_service_cleanly_and_promptly(profiler):
    proc, addr = profiler
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert time.monotonic() - started < 10


@pytest.mark.reliability("R22")
def test_a_frozen_peer_is_detected_by_keepalive_in_seconds_not_at_the_deadline():
    """SIGSTOP the server mid-call: the client's pings go unanswered and the call fails
    UNAVAILABLE after about keepalive + ping timeout, long before its 60 s deadline."""
    proc, addr = start_profiler()
    cfg = ServiceConfig(keepalive_s=1.0, keepalive_timeout_s=1.0, insecure=True)
    try:
        with make_channel(addr, cfg) as ch:
            stub = profiler_pb2_grpc.ProfilerServiceStub(ch)
            stub.GetSiteProfiles(profiler_pb2.GetSiteProfilesRequest(), timeout=5)  # connected
            proc.send_signal(signal.SIGSTOP)
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as exc:
                stub.GetSiteProfiles(profiler_pb2.GetSiteProfilesRequest(), timeout=60)
            elapsed = time.monotonic() - started
        assert exc.value.code() is grpc.StatusCode.UNAVAILABLE
        assert elapsed < 10
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def test_help_lists_the_environment_and_exits_0_before_binding_any_port():
    """Both ports already taken: a service that tried to serve would fail, --help does not."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        env = {**os.environ, "POWERTRIP_BIND_HOST": "127.0.0.1"}
        env |= {"POWERTRIP_GRPC_PORT": port, "POWERTRIP_METRICS_PORT": port}
        done = subprocess.run(
            [service_executable("profiler"), "--help"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    assert "POWERTRIP_PROBE_INTERVAL_S" in done.stdout and "POWERTRIP_GRPC_PORT" in done.stdout
    assert not READY.search(done.stdout)


def test_an_unknown_argument_is_refused_with_exit_2_and_names_it():
    done = subprocess.run(
        [service_executable("profiler"), "--grpc-port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unrecognized arguments: --grpc-port 1" in done.stderr and "Traceback" not in done.stderr
