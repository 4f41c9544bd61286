"""/metrics answers anyone who reaches it (no TLS, no login), so a service started by default
binds it to 127.0.0.1 only; POWERTRIP_METRICS_ADDR opens it to a network, as the deploys do
(reliability matrix R38). Real processes, connected to from this machine's own non-loopback
address: what another host would use."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from powertrip.services.cli.service_process import READY, service_executable


def outside_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only the route's source address is read
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") else addr


def listening_on(port: int) -> set[str]:
    """The IPv4 addresses a TCP socket of this machine listens on at ``port`` (/proc/net/tcp)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        hex_addr, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            out.add(socket.inet_ntoa(bytes.fromhex(hex_addr)[::-1]))
    return out


def scrape(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as reply:
        return reply.read().decode()


@contextlib.contextmanager
def profiler(**env: str) -> Iterator[int]:
    """A real profiler, its settings the defaults but for ``env``; yields its metrics port."""
    base = {k: v for k, v in os.environ.items() if k != "POWERTRIP_METRICS_ADDR"}
    proc = subprocess.Popen(
        [service_executable("profiler")],
        env={**base, "POWERTRIP_GRPC_PORT": "0", "POWERTRIP_METRICS_PORT": "0", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        ready = READY.search(proc.stdout.readline())
        assert ready, "the profiler did not start"
        yield int(ready.group(3))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


@pytest.mark.reliability("R38")
def test_by_default_metrics_answer_on_loopback_and_not_on_the_network():
    outside = outside_address()
    with profiler() as port:
        assert "grpc_server_handled_total" in scrape("127.0.0.1", port)
        if Path("/proc/net/tcp").exists():
            assert listening_on(port) == {"127.0.0.1"}
        if outside is None:
            pytest.skip("this machine has no non-loopback IPv4 address to connect from")
        with pytest.raises(OSError):  # connection refused: nothing listens there
            scrape(outside, port)


@pytest.mark.reliability("R38")
def test_metrics_addr_opens_them_to_the_network_when_asked():
    outside = outside_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    with profiler(POWERTRIP_METRICS_ADDR="0.0.0.0") as port:
        assert "grpc_server_handled_total" in scrape(outside, port)
