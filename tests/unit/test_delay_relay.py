"""The application-level delay relay (the latency path where the kernel has no netem).

An echo server sits behind a relay started exactly as a harness would start it:
`python -m powertrip.services.netem.delay_relay --listen 127.0.0.1:0 --target ... --delay-ms D`.
"""

from __future__ import annotations

import os
import socket
import socketserver
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from powertrip.services.netem import delay_relay

REPO = Path(__file__).resolve().parents[2]
DELAY_MS = 50.0


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)
        self.request.shutdown(socket.SHUT_WR)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


class Relay:
    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.port = port
        self.stderr = ""

    def stop(self) -> str:
        """Stops this relay (our own child, by its handle) and returns its log."""
        if self.proc.poll() is None:
            self.proc.terminate()
        _, self.stderr = self.proc.communicate(timeout=10)
        return self.stderr


@pytest.fixture
def start_relay() -> Iterator[Callable[[int, float], Relay]]:
    relays: list[Relay] = []

    def start(target_port: int, delay_ms: float) -> Relay:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "powertrip.services.netem.delay_relay",
                "--listen",
                "127.0.0.1:0",
                "--target",
                f"127.0.0.1:{target_port}",
                "--delay-ms",
                str(delay_ms),
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = proc.stdout.readline()  # the bound port, printed once the relay is listening
        relay = Relay(proc, int(line) if line.strip().isdigit() else -1)
        relays.append(relay)
        assert relay.port > 0, f"relay printed {line!r}; log: {relay.stop()}"
        return relay

    yield start
    for relay in relays:
        relay.stop()


def round_trip_s(sock: socket.socket, message: bytes) -> float:
    start = time.perf_counter()
    sock.sendall(message)
    got = b""
    while len(got) < len(message):
        chunk = sock.recv(65536)
        assert chunk, "relay closed the connection mid-exchange"
        got += chunk
    assert got == message
    return time.perf_counter() - start


def test_round_trip_through_the_relay_takes_twice_the_one_way_delay(echo_port, start_relay):
    relay = start_relay(echo_port, DELAY_MS)
    with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = [round_trip_s(sock, f"ping {i}".encode()) for i in range(5)]
    rtt_ms = statistics.median(rtts) * 1e3
    print(f"relay RTT with {DELAY_MS:g} ms one-way: median {rtt_ms:.1f} ms of {len(rtts)}")
    assert rtt_ms == pytest.approx(2 * DELAY_MS, rel=0.20)


def test_a_megabyte_comes_back_intact_in_order_and_without_per_chunk_stalls(echo_port, start_relay):
    relay = start_relay(echo_port, DELAY_MS)
    payload = os.urandom(1 << 20)
    with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as sock:
        start = time.perf_counter()

        def send() -> None:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)  # the relay passes the half-close on to the echo

        sender = threading.Thread(target=send)
        sender.start()
        received = bytearray()
        while chunk := sock.recv(1 << 16):
            received += chunk
        elapsed = time.perf_counter() - start
        sender.join(timeout=5)
    assert bytes(received) == payload
    # Chunks are pipelined: ~one RTT plus copying. A relay that waited out the delay chunk by
    # chunk would need >= 16 chunks x 2 directions x 50 ms = 1.6 s for a megabyte.
    print(f"1 MiB echoed through the relay in {elapsed * 1e3:.0f} ms")
    assert elapsed < 0.8


def test_startup_log_says_netem_is_unavailable_and_what_is_emulated(echo_port, start_relay):
    log = start_relay(echo_port, 40).stop()
    assert "netem unavailable: emulating 40 ms one-way delay in the application-level relay" in log


def test_a_client_is_disconnected_and_the_failure_logged_when_the_target_is_down(start_relay):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]  # bound, never listening: connections are refused
        relay = start_relay(dead_port, DELAY_MS)
        with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as sock:
            assert sock.recv(1) == b""
    assert "cannot reach target" in relay.stop()


def test_a_negative_delay_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        delay_relay.main(["--listen", "127.0.0.1:0", "--target", "127.0.0.1:1", "--delay-ms", "-1"])
    assert exit_.value.code == 2
    assert "delay must be >= 0" in capsys.readouterr().err
