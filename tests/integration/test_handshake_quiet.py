"""Quiet under a handshake flood: refused TLS handshakes against a real service cost a bounded
log, one summary line now and then, not one line each. Before, gRPC's core logged every refused
handshake at INFO (GRPC_VERBOSITY unset): about 200 bytes each, 445 KB for 2,100 attempts; with
``services/__init__`` setting GRPC_VERBOSITY=ERROR and ``tls.RefusedSummary`` it is a few
hundred bytes for the whole flood. (Garbage and invalid requests: test_abuse_quiet.py.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest

from powertrip.services.cli.certs import issue, mint_cluster, new_ca, tls_env, write_pair
from powertrip.services.cli.service_process import start_service
from powertrip.services.common.identity import PROFILER

pytestmark = [pytest.mark.slow, pytest.mark.reliability("R14", "R24")]

ATTEMPTS = 300  # refused handshakes, three kinds in turn
LOG_BOUND = 2_000  # bytes the service may log for all of them (was ~200 per handshake)


def refused_handshake(address: str, kind: int, certs: Path) -> None:
    """One connection the server refuses: plaintext, TLS without a client certificate, or a
    client certificate from another CA. Each on its own channel, so each is a new handshake."""
    ca = (certs / "ca.pem").read_bytes()
    name = [("grpc.ssl_target_name_override", PROFILER)]
    if kind == 0:
        channel = grpc.insecure_channel(address)
    elif kind == 1:
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(ca), name)
    else:
        key, cert = (certs / "foreign" / f"w0.{ext}" for ext in ("key", "pem"))
        creds = grpc.ssl_channel_credentials(ca, key.read_bytes(), cert.read_bytes())
        channel = grpc.secure_channel(address, creds, name)
    with channel, pytest.raises(grpc.RpcError) as exc:
        channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=5)
    assert exc.value.code() is grpc.StatusCode.UNAVAILABLE


def test_a_flood_of_refused_handshakes_writes_a_bounded_log(tmp_path):
    certs = tmp_path / "certs"
    mint_cluster(certs, ["w0"])
    (certs / "foreign").mkdir()
    write_pair(certs / "foreign", "w0", *issue(new_ca("someone else's CA"), "w0"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POWERTRIP_", "GRPC_"))}
    env |= {
        "POWERTRIP_BIND_HOST": "127.0.0.1",
        "POWERTRIP_GRPC_PORT": "0",
        "POWERTRIP_METRICS_PORT": "0",
        **tls_env(certs, PROFILER),
    }
    service = start_service("profiler", "profiler", env, tmp_path / "logs")
    try:
        service.wait_ready(60)
        time.sleep(0.5)  # the start-up lines are written
        before = service.log_path.stat().st_size
        started = time.monotonic()
        for i in range(ATTEMPTS):
            refused_handshake(service.grpc_addr, i % 3, certs)
        elapsed = time.monotonic() - started
        time.sleep(0.5)
        assert service.process.poll() is None
    finally:
        service.process.terminate()
        service.process.wait(timeout=30)
    with service.log_path.open("rb") as f:
        f.seek(before)
        added = f.read()
    print(f"\n{ATTEMPTS} refused handshakes in {elapsed:.1f} s: {len(added)} bytes of log")
    assert len(added) < LOG_BOUND, added.decode(errors="replace")[-2000:]
    assert b"Handshake failed" not in added
    assert b"made no authenticated call" in added  # quiet, not silent
