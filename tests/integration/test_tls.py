"""Mutual TLS: only holders of a certificate from the cluster's CA get past the handshake, a
certificate speaks only for its own worker id, and an allow-list narrows who may join. Refusals
leave the aggregator's registry and rounds untouched. Plaintext needs POWERTRIP_INSECURE=1.
(More identity rules, the allow-list file, the health port: test_identity.py.)"""

from __future__ import annotations

import contextlib
import datetime as dt
from pathlib import Path

import grpc
import numpy as np
import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import NameOID
from prometheus_client import REGISTRY

from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.run import AggregatorRun
from powertrip.services.aggregator.service_handlers import add_to_server
from powertrip.services.aggregator.servicer import AggregatorServicer
from powertrip.services.cli.certs import (
    issue,
    load_authority,
    mint_cluster,
    new_ca,
    tls_env,
    write_pair,
)
from powertrip.services.cli.launcher import ClusterPlan, LaunchError, LocalCluster
from powertrip.services.cli.main import main as powertrip
from powertrip.services.common.config import ConfigError, ServiceConfig, load_config
from powertrip.services.common.grpc_client import make_channel, retry_idempotent
from powertrip.services.common.grpc_server import build_server, set_serving
from powertrip.services.common.identity import AGGREGATOR
from powertrip.services.worker.sites_host import SiteUpdate
from powertrip.services.worker.uploader import update_messages
from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc

SERVICE = "powertrip.v1.AggregatorService"
C = grpc.StatusCode


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """The cluster's CA and certificates (w0, w1, w9), plus two impostors presenting CN=w0: one
    signed by a foreign CA, one by our CA but expired. Each lives in its own directory next to
    the genuine ca.pem, so it can be loaded with the same ``tls_env`` as a real worker."""
    d = tmp_path_factory.mktemp("pki")
    mint_cluster(d, ["w0", "w1", "w9"])
    foreign = d / "foreign"
    foreign.mkdir()
    (foreign / "ca.pem").write_bytes((d / "ca.pem").read_bytes())
    write_pair(foreign, "w0", *issue(new_ca("someone else's CA"), "w0"))
    return d


@pytest.fixture(scope="module")
def expired_dir(pki) -> Path:
    """CN=w0 from our own (kept) CA, valid last month only."""
    d = pki / "expired"
    d.mkdir()
    (d / "ca.pem").write_bytes((pki / "ca.pem").read_bytes())
    last_month = dt.datetime.now(dt.UTC) - dt.timedelta(days=40)
    write_pair(d, "w0", *issue(load_authority(pki), "w0", days=1, not_before=last_month))
    return d


def aggregator_cfg(certs: Path, allowed: str = "w0,w1") -> AggregatorConfig:
    return load_config(
        AggregatorConfig,
        {
            "POWERTRIP_PROFILER_ADDR": "127.0.0.1:1",
            "POWERTRIP_NUM_SITES": "4",
            "POWERTRIP_NUM_SAMPLES": "1000",
            "POWERTRIP_CHECKPOINT_DIR": "",
            "POWERTRIP_ALLOWED_WORKERS": allowed,
            **tls_env(certs, "aggregator"),
        },
    )


def serve_aggregator(cfg: AggregatorConfig) -> tuple[grpc.Server, str, AggregatorRun]:
    run = AggregatorRun(cfg)
    server, port, health = build_server(
        [lambda s: add_to_server(AggregatorServicer(run), s)],
        "127.0.0.1:0",
        cfg,
        [SERVICE],
    )
    server.start()
    set_serving(health, [SERVICE], True)
    return server, f"127.0.0.1:{port}", run


@pytest.fixture(scope="module")
def aggregator(pki):
    server, address, run = serve_aggregator(aggregator_cfg(pki))
    yield address, run
    server.stop(grace=None)


def as_worker(address: str, certs: Path, name: str) -> aggregator_pb2_grpc.AggregatorServiceStub:
    """A stub presenting ``name``'s certificate, as is: a service would refuse to start with an
    expired or foreign one (test_cert_lifecycle.py), an attacker's client would not."""
    env = {k.removeprefix("POWERTRIP_").lower(): v for k, v in tls_env(certs, name).items()}
    cfg = ServiceConfig.model_construct(**env)
    return aggregator_pb2_grpc.AggregatorServiceStub(make_channel(address, cfg, AGGREGATOR))


def register(stub, worker_id: str, sites: list[str]) -> aggregator_pb2.RegisterWorkerResponse:
    return stub.RegisterWorker(
        aggregator_pb2.RegisterWorkerRequest(
            worker_id=worker_id, address="127.0.0.1:9", site_ids=sites
        ),
        timeout=5,
    )


def refusal(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as exc:
        call()
    return exc.value.code(), exc.value.details()


@contextlib.contextmanager
def counted_as_refused_handshakes():
    """The block opens at least one TLS connection and authenticates none: the difference
    between the two counters is what docs/security.md calls refused handshakes."""
    before = tls_counts()
    yield
    after = tls_counts()
    assert after[0] > before[0], "the fetcher did not count the connection"
    assert after[1] == before[1], "a refused handshake was counted as authenticated"


def tls_counts() -> tuple[float, float]:
    get = REGISTRY.get_sample_value
    return (
        get("powertrip_tls_connections_total") or 0.0,
        get("powertrip_tls_authenticated_connections_total") or 0.0,
    )


# -- configuration ---------------------------------------------------------------------------


def test_no_tls_settings_are_refused_unless_plaintext_is_asked_for_explicitly(pki):
    for env in ({}, {"POWERTRIP_TLS_CERT_PATH": ""}):
        with pytest.raises(ConfigError, match="TLS is not configured.*POWERTRIP_INSECURE=1"):
            load_config(ServiceConfig, env)
    assert not load_config(ServiceConfig, {"POWERTRIP_INSECURE": "1"}).tls
    with pytest.raises(ConfigError, match="contradicts"):
        load_config(ServiceConfig, {**tls_env(pki, "w0"), "POWERTRIP_INSECURE": "1"})


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        (("cert",), ("POWERTRIP_TLS_KEY_PATH", "POWERTRIP_TLS_CA_PATH")),
        (("cert", "key"), ("POWERTRIP_TLS_CA_PATH",)),
        (("ca",), ("POWERTRIP_TLS_CERT_PATH", "POWERTRIP_TLS_KEY_PATH")),
    ],
)
def test_half_a_tls_configuration_is_refused_naming_what_is_missing(pki, given, missing):
    full = tls_env(pki, "w0")
    env = {k: v for k, v in full.items() if any(f"_{g.upper()}_" in k for g in given)}
    with pytest.raises(ConfigError) as exc:
        load_config(ServiceConfig, env)
    assert all(name in str(exc.value) for name in missing)
    assert not any(name in str(exc.value) for name in env)


def test_a_tls_file_that_does_not_exist_is_refused_at_start(pki):
    env = {**tls_env(pki, "w0"), "POWERTRIP_TLS_KEY_PATH": str(pki / "nope.key")}
    with pytest.raises(ConfigError, match="POWERTRIP_TLS_KEY_PATH.*no such file"):
        load_config(ServiceConfig, env)


def test_the_allow_list_is_a_comma_separated_set_of_worker_ids(pki):
    assert aggregator_cfg(pki, " w0, w1 ,").allowed_worker_ids == {"w0", "w1"}
    assert aggregator_cfg(pki, "").allowed_worker_ids is None


# -- powertrip certs ----------------------------------------------------------------------------


def test_certs_mints_a_ca_and_one_private_certificate_per_service_and_worker(tmp_path):
    r = CliRunner().invoke(powertrip, ["certs", "--out", str(tmp_path), "--workers", "w0,w1"])
    assert r.exit_code == 0, r.output
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    for name in ("aggregator", "profiler", "operator", "w0", "w1"):
        cert = x509.load_pem_x509_certificate((tmp_path / f"{name}.pem").read_bytes())
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == name
        # its own identity and nothing else: no loopback, no peer's name, no address
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert list(san) == [x509.DNSName(name)]
        assert (tmp_path / f"{name}.key").stat().st_mode & 0o077 == 0
    assert (tmp_path / "ca.key").stat().st_mode & 0o077 == 0  # kept, for renewal: owner-only


def test_certs_refuses_a_worker_id_that_is_a_service_name(tmp_path):
    r = CliRunner().invoke(powertrip, ["certs", "--out", str(tmp_path), "--workers", "aggregator"])
    assert r.exit_code == 2 and "collide" in r.output
    assert not (tmp_path / "ca.pem").exists()


def test_up_mints_into_the_output_directory_unless_insecure(tmp_path, monkeypatch):
    plans: list[ClusterPlan] = []

    class Recorder(LocalCluster):
        def start(self, on_started=None) -> None:
            plans.append(self.plan)
            raise LaunchError("recorded")

    monkeypatch.setattr("powertrip.services.cli.up.LocalCluster", Recorder)
    out = tmp_path / "up"
    for args in (["--tls"], []):  # --tls: the default, kept as an alias
        r = CliRunner().invoke(powertrip, ["up", *args, "--workers", "2", "--output", str(out)])
        assert r.exit_code == 1 and "recorded" in r.output
        assert plans[-1].tls_path == out / "tls" and not plans[-1].insecure
    r = CliRunner().invoke(powertrip, ["up", "--insecure", "--workers", "2", "--output", str(out)])
    assert plans[-1].tls_path is None and plans[-1].insecure
    env = Recorder(plans[-1])._env("w0")
    assert env["POWERTRIP_INSECURE"] == "1" and "POWERTRIP_TLS_CERT_PATH" not in env


# -- unauthenticated callers fail the handshake -----------------------------------------------


def test_a_worker_with_a_valid_certificate_registers(aggregator, pki):
    address, run = aggregator
    before = tls_counts()
    reply = register(as_worker(address, pki, "w0"), "w0", ["site-000", "site-001"])
    after = tls_counts()
    assert after[0] - before[0] >= 1 and after[1] - before[1] == 1  # one connection, verified
    assert reply.run_seed == run.run_seed
    assert run.registry.owner(0).worker_id == "w0"


@pytest.mark.reliability("R14")
def test_a_plaintext_caller_cannot_reach_a_tls_server(aggregator):
    address, run = aggregator
    before = run.registry.site_count
    stub = aggregator_pb2_grpc.AggregatorServiceStub(grpc.insecure_channel(address))
    code, _ = refusal(lambda: register(stub, "w1", ["site-003"]))
    assert code == C.UNAVAILABLE
    assert run.registry.site_count == before and run.registry.owner(3) is None


@pytest.mark.reliability("R14")
def test_a_tls_caller_without_a_client_certificate_fails_the_handshake(aggregator, pki):
    address, run = aggregator
    creds = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
    name = [("grpc.ssl_target_name_override", AGGREGATOR)]  # the server is genuine: verify it
    stub = aggregator_pb2_grpc.AggregatorServiceStub(grpc.secure_channel(address, creds, name))
    with counted_as_refused_handshakes():
        code, _ = refusal(lambda: register(stub, "w1", ["site-003"]))
    assert code == C.UNAVAILABLE
    assert run.registry.owner(3) is None


@pytest.mark.reliability("R14")
def test_a_certificate_from_a_foreign_ca_fails_the_handshake(aggregator, pki):
    address, run = aggregator
    with counted_as_refused_handshakes():
        code, _ = refusal(
            lambda: register(as_worker(address, pki / "foreign", "w0"), "w0", ["site-003"])
        )
    assert code == C.UNAVAILABLE
    assert run.registry.owner(3) is None


@pytest.mark.reliability("R14")
def test_an_expired_certificate_fails_the_handshake(aggregator, expired_dir):
    """Server and client share a CA; only the client's validity period is wrong."""
    address, run = aggregator
    stub = as_worker(address, expired_dir, "w0")
    with counted_as_refused_handshakes():
        code, _ = refusal(lambda: register(stub, "w0", ["site-003"]))
    assert code == C.UNAVAILABLE
    assert run.registry.owner(3) is None


def test_a_worker_that_cannot_verify_the_server_gives_up_at_once(aggregator, tmp_path):
    """A wrong CA fails the same way every time: no retry storm."""
    address, _ = aggregator
    mint_cluster(tmp_path, ["w0"])  # another cluster's CA and certificates
    stub = as_worker(address, tmp_path, "w0")
    attempts = []

    @retry_idempotent(max_seconds=10, max_attempts=5)
    def join() -> None:
        attempts.append(1)
        register(stub, "w0", ["site-003"])

    code, details = refusal(join)
    assert code == C.UNAVAILABLE and "not signed by our CA" in details
    assert len(attempts) == 1


# -- a certificate speaks only for its own worker id ------------------------------------------


def test_a_worker_cannot_register_under_another_workers_id(aggregator, pki):
    address, run = aggregator
    code, details = refusal(lambda: register(as_worker(address, pki, "w0"), "w1", ["site-002"]))
    assert code == C.PERMISSION_DENIED and "'w0'" in details and "'w1'" in details
    assert run.registry.owner(2) is None


def test_a_worker_cannot_submit_an_update_in_another_workers_name(aggregator, pki):
    address, run = aggregator
    register(as_worker(address, pki, "w0"), "w0", ["site-000", "site-001"])
    delta = {k: np.zeros(v.shape, v.dtype) for k, v in run.executor.params.items()}
    update = SiteUpdate(0, delta, 10.0, 0.1)
    spoof = as_worker(address, pki, "w1")  # a genuine w1 certificate, claiming w0's site
    code, _ = refusal(
        lambda: spoof.SubmitUpdate(update_messages("w0", 0, update, 4096), timeout=10)
    )
    # without the identity check this would be FAILED_PRECONDITION (no round is open)
    assert code == C.PERMISSION_DENIED
    assert run.registry.owner(0).worker_id == "w0"


# -- the allow-list ---------------------------------------------------------------------------


def test_a_valid_certificate_not_on_the_allow_list_is_refused_at_registration(aggregator, pki):
    address, run = aggregator
    code, details = refusal(lambda: register(as_worker(address, pki, "w9"), "w9", ["site-003"]))
    assert code == C.PERMISSION_DENIED and "allow-list" in details
    assert run.registry.owner(3) is None


# -- a whole cluster over mTLS ----------------------------------------------------------------


@pytest.mark.slow
def test_a_tls_cluster_of_two_workers_and_four_sites_completes_its_rounds(tmp_path):
    plan = ClusterPlan(
        workers=2,
        sites=4,
        preset="quick",
        target=0.99,
        max_rounds=3,
        seed=0,
        num_samples=1000,
        round_deadline_s=30,
        log_dir=tmp_path / "logs",
        checkpoint_dir=tmp_path / "checkpoints",
        tls_dir=tmp_path / "tls",
        extra_env={"POWERTRIP_ALLOWED_WORKERS": "worker-0,worker-1"},
    )
    with LocalCluster(plan) as cluster:
        cluster.start()
        status = cluster.wait_done(timeout_s=240)
        plaintext = aggregator_pb2_grpc.AggregatorServiceStub(
            grpc.insecure_channel(cluster.aggregator.grpc_addr)
        )
        code, _ = refusal(lambda: plaintext.GetStatus(aggregator_pb2.GetStatusRequest(), timeout=5))
    assert status.state == aggregator_pb2.RUN_STATE_DONE, status.message
    assert status.registered_sites == 4
    assert status.round == 3
    assert all(r.contributions == len(r.selected_site_ids) > 0 for r in status.rounds)
    assert code == C.UNAVAILABLE  # the cluster really spoke TLS
    assert (tmp_path / "tls" / "worker-1.pem").is_file()
