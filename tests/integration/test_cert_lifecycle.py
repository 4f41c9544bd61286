"""Certificates that live (R29): the CA key is kept so leaves are renewed from the same CA (and
workers added) without touching ca.pem; running clients and servers pick renewed files up
without a restart; a certificate that is expired, not yet valid (clock skew) or from another
CA is named in one line at once (not "Socket closed" after minutes of retries), and a service
holding one refuses to start. Real gRPC servers on real sockets, real certificates."""

from __future__ import annotations

import datetime as dt
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from cryptography import x509

from powertrip.services.cli.certs import (
    issue,
    load_authority,
    mint_cluster,
    new_ca,
    tls_env,
    write_pair,
)
from powertrip.services.cli.main import main as powertrip
from powertrip.services.common.cert_check import CLOCK_SKEW_MARGIN
from powertrip.services.common.config import ConfigError, ServiceConfig, load_config
from powertrip.services.common.grpc_client import make_channel, retry_idempotent
from powertrip.services.common.grpc_server import build_server
from powertrip.services.common.identity import AGGREGATOR

pytestmark = pytest.mark.reliability("R29")
REPO = Path(__file__).resolve().parents[2]
WHO = "/test.Peer/Who"  # answers the serial of the certificate the caller presented


def serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def who_am_i(request: bytes, context: grpc.ServicerContext) -> bytes:
    pem = context.auth_context()["x509_pem_cert"][0]
    return str(x509.load_pem_x509_certificate(pem).serial_number).encode()


def unchecked(certs: Path, name: str) -> ServiceConfig:
    """``name``'s files as a client would hold them, skipping the start-up checks (these tests
    present certificates a service would refuse to start with)."""
    env = {k.removeprefix("POWERTRIP_").lower(): v for k, v in tls_env(certs, name).items()}
    return ServiceConfig.model_construct(**env)


def serve(certs: Path, name: str = AGGREGATOR) -> tuple[grpc.Server, str]:
    """A real TLS server (the services' own builder and credentials) presenting ``name``."""
    handler = grpc.method_handlers_generic_handler(
        "test.Peer", {"Who": grpc.unary_unary_rpc_method_handler(who_am_i)}
    )
    server, port, _ = build_server(
        [lambda s: s.add_generic_rpc_handlers((handler,))],
        "127.0.0.1:0",
        unchecked(certs, name),
        [],
    )
    server.start()
    return server, f"127.0.0.1:{port}"


def who(channel: grpc.Channel) -> int:
    return int(channel.unary_unary(WHO)(b"", timeout=5))


@pytest.fixture
def pki(tmp_path) -> Path:
    mint_cluster(tmp_path, ["w0", "w1"])
    return tmp_path


# -- powertrip certs: renew and extend from the kept CA ---------------------------------------


def test_renewal_reissues_every_certificate_from_the_same_ca(pki):
    ca_before = (pki / "ca.pem").read_bytes()
    before = {n: serial(pki / f"{n}.pem") for n in ("aggregator", "profiler", "operator", "w0")}
    r = CliRunner().invoke(powertrip, ["certs", "--out", str(pki), "--renew", "--days", "30"])
    assert r.exit_code == 0, r.output
    assert (pki / "ca.pem").read_bytes() == ca_before  # running peers keep trusting each other
    ca = x509.load_pem_x509_certificate(ca_before)
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=30)
    for name, old in before.items():
        cert = x509.load_pem_x509_certificate((pki / f"{name}.pem").read_bytes())
        cert.verify_directly_issued_by(ca)
        assert cert.serial_number != old
        assert abs(cert.not_valid_after_utc - soon) < dt.timedelta(minutes=10)
    assert "renewed 5 certificates" in r.output  # 3 services, 2 workers


def test_a_worker_is_added_without_reminting_the_others(pki):
    kept = {n: (pki / n).read_bytes() for n in ("ca.pem", "ca.key", "w0.pem", "aggregator.pem")}
    r = CliRunner().invoke(powertrip, ["certs", "--out", str(pki), "--workers", "w0,w2"])
    assert r.exit_code == 0, r.output
    assert {n: (pki / n).read_bytes() for n in kept} == kept
    ca = x509.load_pem_x509_certificate(kept["ca.pem"])
    x509.load_pem_x509_certificate((pki / "w2.pem").read_bytes()).verify_directly_issued_by(ca)
    assert "added 1 certificates" in r.output and "w2" in r.output


def test_defaults_a_long_lived_ca_short_lived_leaves_valid_from_the_skew_margin(tmp_path):
    r = CliRunner().invoke(powertrip, ["certs", "--out", str(tmp_path), "--workers", "w0"])
    assert r.exit_code == 0, r.output
    now = dt.datetime.now(dt.UTC)
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    leaf = x509.load_pem_x509_certificate((tmp_path / "w0.pem").read_bytes())
    assert ca.not_valid_after_utc - now > dt.timedelta(days=3600)
    assert dt.timedelta(days=89) < leaf.not_valid_after_utc - now < dt.timedelta(days=91)
    started = now - leaf.not_valid_before_utc
    assert (
        CLOCK_SKEW_MARGIN - dt.timedelta(seconds=30)
        < started
        < CLOCK_SKEW_MARGIN + dt.timedelta(minutes=1)
    )


# -- renewed files are used without a restart -------------------------------------------------


def test_a_client_presents_its_renewed_certificate_without_a_restart(pki):
    """A worker keeps calling while its files are renewed from the kept CA: no call fails, and
    within a few seconds the server sees the new certificate. (Before, a client read its files
    once, when the channel was made: the server saw the old serial until a restart.)"""
    server, address = serve(pki)
    channel = make_channel(address, load_config(ServiceConfig, tls_env(pki, "w0")), AGGREGATOR)
    seen: list[int] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def keep_calling() -> None:
        while not stop.is_set():
            try:
                seen.append(who(channel))
            except grpc.RpcError as exc:
                failures.append(exc)
            time.sleep(0.02)

    caller = threading.Thread(target=keep_calling)
    caller.start()
    try:
        old = serial(pki / "w0.pem")
        time.sleep(0.5)
        assert seen and set(seen) == {old}
        r = CliRunner().invoke(powertrip, ["certs", "--out", str(pki), "--renew"])
        assert r.exit_code == 0, r.output
        new = serial(pki / "w0.pem")
        renewed = time.monotonic()
        while new not in seen and time.monotonic() - renewed < 5:
            time.sleep(0.05)
        switched = time.monotonic() - renewed
    finally:
        stop.set()
        caller.join()
        server.stop(grace=None)
    assert new in seen, f"still presenting the old certificate after {switched:.1f} s"
    assert switched < 3
    assert not failures, failures[:1]
    assert seen[-1] == new


def test_a_client_moves_to_a_new_ca_that_the_server_already_trusts(pki, tmp_path_factory):
    """Replacing the CA: the server trusts old and new CA (a bundle), the client's files are
    replaced by a pair from the new CA, and its next calls present that."""
    new_dir = tmp_path_factory.mktemp("new-ca")
    fresh = new_ca("the next CA")
    write_pair(new_dir, "w0", *issue(fresh, "w0"))
    bundle = (pki / "ca.pem").read_bytes() + fresh.pem
    (pki / "ca.pem").write_bytes(bundle)  # the server (and the client) trust both
    server, address = serve(pki)
    try:
        channel = make_channel(address, unchecked(pki, "w0"), AGGREGATOR)
        assert who(channel) == serial(pki / "w0.pem")
        next_serial = serial(new_dir / "w0.pem")
        os.replace(new_dir / "w0.key", pki / "w0.key")
        os.replace(new_dir / "w0.pem", pki / "w0.pem")
        time.sleep(1.1)  # the files are looked at at most once a second
        assert who(channel) == next_serial
    finally:
        server.stop(grace=None)


def test_a_stub_called_after_its_channel_closed_raises_instead_of_crashing(pki):
    """The profiler closes a worker's channel when the worker re-registers, while a probe may
    still hold its stub. grpcio kills the process (SIGSEGV) when a registered method is made on
    a closed channel, which the reloading channel does at a stub's first call: it must say
    ValueError, as grpcio does for a closed channel's existing methods. (In a child process:
    a crash must not take the test run with it.)"""
    code = f"""
import grpc
from pathlib import Path
from powertrip.v1 import worker_pb2, worker_pb2_grpc
from powertrip.services.cli.certs import tls_env
from powertrip.services.common.config import ServiceConfig, load_config
from powertrip.services.common.grpc_client import make_channel
cfg = load_config(ServiceConfig, tls_env(Path({str(pki)!r}), "profiler"))
channel = make_channel("127.0.0.1:1", cfg, "w0")
stub = worker_pb2_grpc.WorkerServiceStub(channel)
channel.close()
try:
    list(stub.ProbeBandwidth(worker_pb2.ProbeBandwidthRequest(total_bytes=1), timeout=1))
except ValueError as exc:
    print("refused:", exc)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POWERTRIP_")}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-500:]}"
    assert "refused: Cannot invoke RPC on closed channel!" in proc.stdout


# -- a refusal says why, at once --------------------------------------------------------------


def pair(pki: Path, folder: Path, name: str, **kw) -> Path:
    """``name``'s pair from the cluster's kept CA (or ``ca`` if given) into ``folder``."""
    folder.mkdir(exist_ok=True)
    (folder / "ca.pem").write_bytes((pki / "ca.pem").read_bytes())
    ca = kw.pop("ca", None) or load_authority(pki)
    write_pair(folder, name, *issue(ca, name, **kw))
    return folder


def refusal_of(address: str, cfg: ServiceConfig, caplog) -> tuple[str, int, float, list[str]]:
    """Join as a worker does (retrying what is transient): the error, attempts, seconds, and
    the lines logged about it."""
    attempts = []
    channel = make_channel(address, cfg, AGGREGATOR)

    @retry_idempotent(max_seconds=30, max_attempts=20)
    def join() -> int:
        attempts.append(1)
        return who(channel)

    started = time.monotonic()
    with caplog.at_level(logging.WARNING), pytest.raises(grpc.RpcError) as exc:
        join()
    elapsed = time.monotonic() - started
    assert exc.value.code() is grpc.StatusCode.UNAVAILABLE
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    return exc.value.details(), len(attempts), elapsed, lines


LAST_MONTH = dt.datetime.now(dt.UTC) - dt.timedelta(days=40)
NEXT_HOUR = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"days": 1, "not_before": LAST_MONTH}, "our certificate expired at "),
        ({"not_before": NEXT_HOUR}, "our certificate is not valid until "),
        ({"ca": new_ca("someone else's CA")}, "is not signed by the CA in "),
    ],
    ids=["expired", "clock-behind", "foreign-ca"],
)
def test_a_refused_client_names_its_own_certificate_problem_at_once(
    pki, tmp_path, kw, reason, caplog
):
    server, address = serve(pki)
    try:
        bad = pair(pki, tmp_path / "bad", "w0", **kw)
        details, attempts, elapsed, lines = refusal_of(address, unchecked(bad, "w0"), caplog)
    finally:
        server.stop(grace=None)
    assert reason in details and details.startswith(f"TLS to aggregator at {address} refused")
    assert attempts == 1 and elapsed < 5  # was: "Socket closed", retried for minutes
    assert lines == [details]  # one line, the same words
    if "valid until" in reason:
        assert "clock reads" in details  # both times shown


def test_a_refusal_that_persists_is_logged_once_not_per_call(pki, tmp_path, caplog, monkeypatch):
    """A heartbeat keeps calling with an expired certificate: every call raises the reason,
    re-diagnosed each time here, but the log gets one line (its "now" changes, not its news)."""
    monkeypatch.setattr("powertrip.services.common.tls_channel.DIAGNOSIS_TTL_S", 0.0)
    server, address = serve(pki)
    bad = pair(pki, tmp_path / "bad", "w0", days=1, not_before=LAST_MONTH)
    channel = make_channel(address, unchecked(bad, "w0"), AGGREGATOR)
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                with pytest.raises(grpc.RpcError, match="expired"):
                    who(channel)
                time.sleep(1.1)
    finally:
        server.stop(grace=None)
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1


def test_a_server_rejecting_our_certificate_is_told_apart_from_a_network_failure(
    pki, tmp_path, caplog
):
    """Our files are fine by our clock and CA, but the server trusts another CA: the probe
    finishes the handshake and sees the server hang up before speaking HTTP/2."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "ca.pem").write_bytes(new_ca("the server's other CA").pem)
    write_pair(elsewhere, AGGREGATOR, *issue(load_authority(pki), AGGREGATOR))
    server, address = serve(elsewhere)
    try:
        details, attempts, elapsed, lines = refusal_of(address, unchecked(pki, "w0"), caplog)
    finally:
        server.stop(grace=None)
    assert "rejected our certificate" in details
    assert attempts == 1 and elapsed < 5 and len(lines) == 1


def test_the_servers_expired_certificate_is_named(pki, tmp_path, caplog):
    bad = pair(pki, tmp_path / "server", AGGREGATOR, days=1, not_before=LAST_MONTH)
    server, address = serve(bad)
    try:
        details, attempts, _, _ = refusal_of(address, unchecked(pki, "w0"), caplog)
    finally:
        server.stop(grace=None)
    assert "the server's certificate expired at " in details and attempts == 1


def test_a_server_that_is_down_is_still_retried(pki):
    """Not a certificate matter: transient, retried (and no probe verdict is invented)."""
    attempts = []
    channel = make_channel("127.0.0.1:1", unchecked(pki, "w0"), AGGREGATOR)

    @retry_idempotent(max_seconds=1.5, max_attempts=3)
    def join() -> int:
        attempts.append(1)
        return who(channel)

    with pytest.raises(grpc.RpcError) as exc:
        join()
    assert attempts == [1, 1, 1] and "refused" not in exc.value.details().split(":")[0]


# -- and at start -----------------------------------------------------------------------------


def test_a_service_with_an_expired_certificate_refuses_to_start_in_one_line(pki, tmp_path):
    bad = pair(pki, tmp_path / "bad", "profiler", days=1, not_before=LAST_MONTH)
    with pytest.raises(ConfigError, match="POWERTRIP_TLS_CERT_PATH=.*our certificate expired at"):
        load_config(ServiceConfig, tls_env(bad, "profiler"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("POWERTRIP_")}
    env |= {"POWERTRIP_GRPC_PORT": "0", "POWERTRIP_METRICS_PORT": "0", **tls_env(bad, "profiler")}
    proc = subprocess.run(
        [sys.executable, "-m", "powertrip.services.profiler"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "our certificate expired at" in lines[0], proc.stderr


def test_a_clock_far_behind_the_minting_one_is_named_at_start(pki, tmp_path):
    bad = pair(pki, tmp_path / "bad", "w0", not_before=NEXT_HOUR)
    with pytest.raises(ConfigError, match="not valid until .* clock reads"):
        load_config(ServiceConfig, tls_env(bad, "w0"))
