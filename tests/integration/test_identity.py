"""Identity binding in every service over real mTLS: a certificate's common name decides what its
holder may call (workers take rounds only from the aggregator, the profiler probes only for the
aggregator or the operator), the allow-list file revokes a worker on its next call, ids are
validated, plaintext needs an explicit flag, and a plaintext port serves health and nothing else.
One TLS aggregator, worker and profiler are shared by the module (in-process, real sockets)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.run import AggregatorRun
from powertrip.services.aggregator.service_handlers import add_to_server
from powertrip.services.aggregator.servicer import AggregatorServicer
from powertrip.services.cli.certs import mint_cluster, tls_env
from powertrip.services.cli.main import main as powertrip
from powertrip.services.common.config import ConfigError, ServiceConfig, load_config
from powertrip.services.common.errors import NotFound
from powertrip.services.common.grpc_client import make_channel
from powertrip.services.common.grpc_server import build_server, set_serving
from powertrip.services.common.identity import AGGREGATOR, PROFILER
from powertrip.services.profiler.catalogue import SiteCatalogue
from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.profiler.servicer import LinkProber, ProfilerServicer
from powertrip.services.worker.config import WorkerConfig
from powertrip.services.worker.runner import RoundRunner
from powertrip.services.worker.servicer import WorkerServicer
from powertrip.services.worker.sites_host import SiteUpdate
from powertrip.services.worker.uploader import GrpcUploader, update_messages
from powertrip.v1 import (
    aggregator_pb2,
    aggregator_pb2_grpc,
    common_pb2,
    profiler_pb2,
    profiler_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)

C = grpc.StatusCode
REPO = Path(__file__).resolve().parents[2]
WORKERS = ["w0", "w1", "w2", "w9"]  # w9 holds a valid certificate but is on no allow-list


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    mint_cluster(d, WORKERS)
    return d


def serve(register, cfg: ServiceConfig, names=()) -> tuple[grpc.Server, str]:
    server, port, health = build_server([register], "127.0.0.1:0", cfg, names)
    server.start()
    set_serving(health, names, True)
    return server, f"127.0.0.1:{port}"


def channel(address: str, pki: Path, name: str, server: str) -> grpc.Channel:
    """A channel presenting ``name``'s certificate to a server that must prove it is ``server``."""
    return make_channel(address, load_config(ServiceConfig, tls_env(pki, name)), server)


def refusal(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as exc:
        call()
    return exc.value.code(), exc.value.details()


def denied(service: str, method: str, reason: str) -> float:
    labels = {"service": service, "method": method, "reason": reason}
    return REGISTRY.get_sample_value("powertrip_auth_denied_total", labels) or 0.0


@pytest.fixture(scope="module")
def allow_file(pki) -> Path:
    path = pki / "allowed.txt"
    path.write_text("# admitted workers\nw0\nw1\nw2  # the one we revoke\n")
    return path


@pytest.fixture(scope="module")
def aggregator(pki, allow_file):
    cfg = load_config(
        AggregatorConfig,
        {
            "POWERTRIP_PROFILER_ADDR": "127.0.0.1:1",
            "POWERTRIP_NUM_SITES": "6",
            "POWERTRIP_NUM_SAMPLES": "1000",
            "POWERTRIP_CHECKPOINT_DIR": "",
            "POWERTRIP_ALLOWED_WORKERS_FILE": str(allow_file),
            "POWERTRIP_HEARTBEAT_S": "0.25",  # lease 1.5 s: a revoked worker lapses quickly
            **tls_env(pki, "aggregator"),
        },
    )
    run = AggregatorRun(cfg)
    servicer = AggregatorServicer(run)
    server, address = serve(lambda s: add_to_server(servicer, s), cfg)
    yield address, run
    server.stop(grace=None)


def agg_stub(address: str, pki: Path, name: str) -> aggregator_pb2_grpc.AggregatorServiceStub:
    return aggregator_pb2_grpc.AggregatorServiceStub(channel(address, pki, name, AGGREGATOR))


def register(stub, worker_id: str, sites: list[str]) -> aggregator_pb2.RegisterWorkerResponse:
    request = aggregator_pb2.RegisterWorkerRequest(
        worker_id=worker_id, address="127.0.0.1:9", site_ids=sites
    )
    return stub.RegisterWorker(request, timeout=5)


def status(address: str, pki: Path, name: str = "operator") -> aggregator_pb2.GetStatusResponse:
    return agg_stub(address, pki, name).GetStatus(aggregator_pb2.GetStatusRequest(), timeout=5)


@pytest.fixture(scope="module")
def worker(pki):
    """A TLS worker (CN w0) hosting site-000, its sites not loaded (it never trains here)."""
    runner = RoundRunner(lambda *a: None)
    servicer = WorkerServicer(runner, [0])
    server, address = serve(
        lambda s: worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, s),
        load_config(ServiceConfig, tls_env(pki, "w0")),
    )
    yield address, runner
    runner.stop()
    server.stop(grace=None)


@pytest.fixture(scope="module")
def profiler(pki, worker):
    """A TLS profiler (CN profiler) already tracking the worker w0 (not probed yet)."""
    cfg = load_config(
        ProfilerConfig,
        {
            "POWERTRIP_NUM_SITES": "6",
            "POWERTRIP_PING_COUNT": "1",
            "POWERTRIP_PROBE_BYTES": str(1 << 16),
            **tls_env(pki, "profiler"),
        },
    )
    prober = LinkProber(cfg)
    prober.track("w0", worker[0], [0])
    servicer = ProfilerServicer(SiteCatalogue(cfg), prober)
    server, address = serve(
        lambda s: profiler_pb2_grpc.add_ProfilerServiceServicer_to_server(servicer, s), cfg
    )
    yield address, prober
    server.stop(grace=None)


def round_stream(sites: list[str]):
    spec = common_pb2.RoundSpec(round=1, run_seed=0, site_ids=sites, deadline_seconds=5)
    yield worker_pb2.StartRoundRequest(spec=spec)


# -- R15: a certificate acts only within its role --------------------------------------------


@pytest.mark.reliability("R15")
def test_a_worker_certificate_claiming_another_worker_registers_and_submits_nothing(
    aggregator, pki
):
    address, run = aggregator
    before = status(address, pki).registered_sites
    w0 = agg_stub(address, pki, "w0")
    n = denied("AggregatorService", "RegisterWorker", "identity_mismatch")
    code, details = refusal(lambda: register(w0, "w1", ["site-005"]))
    assert code == C.PERMISSION_DENIED and "'w0'" in details and "'w1'" in details
    assert denied("AggregatorService", "RegisterWorker", "identity_mismatch") == n + 1
    update = SiteUpdate(
        5, {k: np.zeros(v.shape, v.dtype) for k, v in run.executor.params.items()}, 10.0, 0.1
    )
    code, _ = refusal(lambda: w0.SubmitUpdate(update_messages("w1", 0, update, 4096), timeout=5))
    assert code == C.PERMISSION_DENIED  # not NOT_FOUND: refused before the site is looked up
    # the same through UploadUpdate (credit-metered, what workers send): refused alike
    as_w1 = GrpcUploader(channel(address, pki, "w0", AGGREGATOR), "w1", 4096)
    code, _ = refusal(lambda: as_w1(0, update, timeout_s=5))
    assert code == C.PERMISSION_DENIED
    st = status(address, pki)
    assert st.registered_sites == before and run.registry.owner(5) is None
    with pytest.raises(NotFound):
        run.registry.worker("w1")


@pytest.mark.reliability("R15")
def test_only_the_aggregator_may_start_a_round_on_a_worker(worker, pki):
    address, runner = worker
    as_w1 = worker_pb2_grpc.WorkerServiceStub(channel(address, pki, "w1", "w0"))
    n = denied("WorkerService", "StartRound", "wrong_role")
    code, details = refusal(lambda: as_w1.StartRound(round_stream(["site-000"]), timeout=5))
    assert code == C.PERMISSION_DENIED and "'w1'" in details
    assert denied("WorkerService", "StartRound", "wrong_role") == n + 1
    assert runner._pending is None and runner.completed_rounds == 0  # nothing queued
    as_aggregator = worker_pb2_grpc.WorkerServiceStub(channel(address, pki, "aggregator", "w0"))
    code, _ = refusal(lambda: as_aggregator.StartRound(round_stream(["site-000"]), timeout=5))
    assert code == C.RESOURCE_EXHAUSTED  # past the identity check: the sites are not loaded


@pytest.mark.reliability("R15")
def test_only_the_aggregator_and_the_profiler_may_probe_a_worker(worker, pki):
    address, _ = worker
    ping = worker_pb2.PingRequest(payload=b"x")
    for name in ("aggregator", "profiler"):
        stub = worker_pb2_grpc.WorkerServiceStub(channel(address, pki, name, "w0"))
        assert stub.Ping(ping, timeout=5).payload == b"x"
    as_w1 = worker_pb2_grpc.WorkerServiceStub(channel(address, pki, "w1", "w0"))
    assert refusal(lambda: as_w1.Ping(ping, timeout=5))[0] == C.PERMISSION_DENIED
    probe = worker_pb2.ProbeBandwidthRequest(total_bytes=1 << 16)
    assert refusal(lambda: list(as_w1.ProbeBandwidth(probe, timeout=5)))[0] == C.PERMISSION_DENIED


@pytest.mark.reliability("R15")
def test_a_worker_certificate_cannot_make_the_profiler_probe(profiler, pki):
    address, prober = profiler
    as_w1 = profiler_pb2_grpc.ProfilerServiceStub(channel(address, pki, "w1", PROFILER))
    for worker_ids in ([], ["w0"]):  # empty = "probe everyone"
        code, _ = refusal(
            lambda ids=worker_ids: as_w1.MeasureLinks(
                profiler_pb2.MeasureLinksRequest(worker_ids=ids), timeout=5
            )
        )
        assert code == C.PERMISSION_DENIED
    assert prober.link("w0").probes == 0  # no probe sent
    track = profiler_pb2.TrackWorkerRequest(worker_id="w1", address="127.0.0.1:9")
    assert refusal(lambda: as_w1.TrackWorker(track, timeout=5))[0] == C.PERMISSION_DENIED
    assert not prober.is_tracked("w1")
    as_aggregator = profiler_pb2_grpc.ProfilerServiceStub(
        channel(address, pki, "aggregator", PROFILER)
    )
    as_aggregator.MeasureLinks(profiler_pb2.MeasureLinksRequest(worker_ids=["w0"]), timeout=10)
    assert prober.link("w0").probes == 1  # the same call from the aggregator probes


def test_profiles_are_readable_by_the_operator_and_tracked_workers_only(profiler, pki):
    address, _ = profiler
    request = profiler_pb2.GetSiteProfilesRequest(time_seconds=0)
    for name in ("aggregator", "operator", "w0"):  # w0 is tracked
        stub = profiler_pb2_grpc.ProfilerServiceStub(channel(address, pki, name, PROFILER))
        assert len(stub.GetSiteProfiles(request, timeout=5).sites) == 6
    as_w2 = profiler_pb2_grpc.ProfilerServiceStub(channel(address, pki, "w2", PROFILER))
    assert refusal(lambda: as_w2.GetSiteProfiles(request, timeout=5))[0] == C.PERMISSION_DENIED


def test_status_is_readable_by_services_and_registered_workers_only(aggregator, pki):
    address, _ = aggregator
    register(agg_stub(address, pki, "w0"), "w0", ["site-000"])
    for name in ("operator", "profiler", "w0"):
        assert status(address, pki, name).expected_sites == 6
    code, _ = refusal(lambda: status(address, pki, "w9"))  # valid certificate, never registered
    assert code == C.PERMISSION_DENIED


# -- R16: the allow-list file, and revocation without a restart ------------------------------


@pytest.mark.reliability("R16")
def test_a_valid_certificate_not_in_the_allow_list_file_is_refused_at_registration(aggregator, pki):
    address, run = aggregator
    n = denied("AggregatorService", "RegisterWorker", "not_allowed")
    code, details = refusal(lambda: register(agg_stub(address, pki, "w9"), "w9", ["site-003"]))
    assert code == C.PERMISSION_DENIED and "not on the allow-list" in details
    assert denied("AggregatorService", "RegisterWorker", "not_allowed") == n + 1
    assert run.registry.owner(3) is None


@pytest.mark.reliability("R16")
def test_removing_a_worker_from_the_allow_list_file_denies_its_next_call_within_2_s(
    aggregator, pki, allow_file
):
    address, run = aggregator
    w1, w2 = agg_stub(address, pki, "w1"), agg_stub(address, pki, "w2")
    register(w1, "w1", ["site-001"])
    register(w2, "w2", ["site-002"])
    allow_file.write_text("w0\nw1\n")
    removed = time.monotonic()
    while True:  # heartbeats, as the worker sends them
        try:
            register(w2, "w2", ["site-002"])
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()
            break
        assert time.monotonic() - removed < 2.5, "still admitted 2.5 s after removal"
        time.sleep(0.1)
    assert code == C.PERMISSION_DENIED and "revoked" in details
    assert time.monotonic() - removed < 2.5
    update = SiteUpdate(
        2, {k: np.zeros(v.shape, v.dtype) for k, v in run.executor.params.items()}, 10.0, 0.1
    )
    code, details = refusal(lambda: w2.SubmitUpdate(update_messages("w2", 0, update, 4096)))
    assert code == C.PERMISSION_DENIED and "revoked" in details
    assert refusal(lambda: status(address, pki, "w2"))[0] == C.PERMISSION_DENIED
    assert register(w1, "w1", ["site-001"]).run_seed == run.run_seed  # others unaffected
    assert status(address, pki, "w1").expected_sites == 6
    # its heartbeats refused, its lease lapses: its site is out of the rounds like a dead one's
    lapse = run.registry.lease_s + 1.0
    while run.registry.is_alive("w2"):
        assert time.monotonic() - removed < 2.5 + lapse, "revoked worker still alive"
        time.sleep(0.05)
    assert 2 in run.registry.offline_sites()


@pytest.mark.reliability("R16")
def test_a_broken_allow_list_file_keeps_the_last_good_list_and_says_where(
    aggregator, pki, allow_file, caplog
):
    address, _ = aggregator
    allow_file.write_text("w0\nw1\nnot an id\n")
    time.sleep(1.1)  # past the re-read interval
    assert register(agg_stub(address, pki, "w1"), "w1", ["site-001"])  # still admitted
    lines = [r.getMessage() for r in caplog.records if "allow-list file" in r.getMessage()]
    assert len(lines) == 1 and str(allow_file) in lines[0] and "line 3" in lines[0]
    allow_file.write_text("w0\nw1\n")  # restore for whoever runs next


def test_a_bad_allow_list_file_is_a_configuration_error_at_start(tmp_path):
    bad = tmp_path / "allowed.txt"
    bad.write_text("w0\nw\x001\n")
    env = {"POWERTRIP_PROFILER_ADDR": "x:1", "POWERTRIP_ALLOWED_WORKERS_FILE": str(bad)}
    with pytest.raises(ConfigError, match=r"POWERTRIP_ALLOWED_WORKERS_FILE.*line 2"):
        load_config(AggregatorConfig, env)


# -- id validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad_id", ["w" * 100_000, "w0\n", "w 0"])
def test_a_malformed_worker_id_is_invalid_and_registers_nothing(aggregator, pki, bad_id):
    address, run = aggregator
    before = run.registry.site_count
    code, details = refusal(lambda: register(agg_stub(address, pki, "w0"), bad_id, ["site-004"]))
    assert code == C.INVALID_ARGUMENT and "bad worker id" in details
    assert len(details) < 200  # truncated, repr'd: "\n" shows as \\n
    assert run.registry.site_count == before and run.registry.owner(4) is None


def test_a_malformed_id_is_refused_by_track_worker_certs_and_worker_config(profiler, pki):
    address, prober = profiler
    stub = profiler_pb2_grpc.ProfilerServiceStub(channel(address, pki, "aggregator", PROFILER))
    track = profiler_pb2.TrackWorkerRequest(worker_id="w\n1", address="127.0.0.1:9")
    assert refusal(lambda: stub.TrackWorker(track, timeout=5))[0] == C.INVALID_ARGUMENT
    assert not prober.is_tracked("w\n1")
    r = CliRunner().invoke(powertrip, ["certs", "--out", str(pki / "x"), "--workers", "a b"])
    assert r.exit_code == 2 and "bad worker id 'a b'" in r.output
    env = {"POWERTRIP_AGGREGATOR_ADDR": "x:1", "POWERTRIP_SITES": "0", "POWERTRIP_INSECURE": "1"}
    with pytest.raises(ConfigError, match="POWERTRIP_WORKER_ID"):
        load_config(WorkerConfig, {**env, "POWERTRIP_WORKER_ID": "x" * 65})
    assert load_config(WorkerConfig, {**env, "POWERTRIP_WORKER_ID": "powertrip-worker-3"})


# -- plaintext only by explicit flag; the health-only port -------------------------------------


def start_profiler(env: dict[str, str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POWERTRIP_")} | env
    return subprocess.Popen(
        [sys.executable, "-m", "powertrip.services.profiler"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_service_without_tls_or_the_insecure_flag_refuses_to_start():
    proc = start_profiler({"POWERTRIP_GRPC_PORT": "0", "POWERTRIP_METRICS_PORT": "0"})
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert err.strip().splitlines() == [
        "powertrip-profiler: TLS is not configured: set POWERTRIP_TLS_CERT_PATH, "
        "POWERTRIP_TLS_KEY_PATH and POWERTRIP_TLS_CA_PATH (`powertrip certs` mints them), "
        "or POWERTRIP_INSECURE=1 for plaintext"
    ]


def test_an_insecure_service_starts_with_a_loud_plaintext_warning():
    env = {
        "POWERTRIP_INSECURE": "1",
        "POWERTRIP_GRPC_PORT": "0",
        "POWERTRIP_METRICS_PORT": "0",
        "POWERTRIP_BIND_HOST": "127.0.0.1",
    }
    proc = start_profiler(env)
    try:
        ready = proc.stdout.readline()  # type: ignore[union-attr]
        assert ready.startswith("READY service=profiler"), ready
        port = ready.split("grpc=")[1].split()[0].rsplit(":", 1)[1]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    warnings = [line for line in err.splitlines() if "PLAINTEXT gRPC" in line]
    assert len(warnings) == 1 and f"PLAINTEXT gRPC on :{port}" in warnings[0]
    assert "level=WARNING" in warnings[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_health_port_is_plaintext_and_serves_health_only(pki):
    port = free_port()
    cfg = load_config(
        ServiceConfig, {**tls_env(pki, "profiler"), "POWERTRIP_HEALTH_PORT": str(port)}
    )
    names = ["powertrip.v1.ProfilerService"]
    prof_cfg = ProfilerConfig(num_sites=2, insecure=True)
    servicer = ProfilerServicer(SiteCatalogue(prof_cfg), LinkProber(prof_cfg))
    server, tls_port, health = build_server(
        [lambda s: profiler_pb2_grpc.add_ProfilerServiceServicer_to_server(servicer, s)],
        "127.0.0.1:0",
        cfg,
        names,
    )
    server.start()
    try:
        plain = grpc.insecure_channel(f"127.0.0.1:{port}")
        check = health_pb2_grpc.HealthStub(plain).Check
        request = health_pb2.HealthCheckRequest(service=names[0])
        serving = health_pb2.HealthCheckResponse
        assert check(request, timeout=5).status == serving.NOT_SERVING
        set_serving(health, names, True)
        assert check(request, timeout=5).status == serving.SERVING
        data = profiler_pb2_grpc.ProfilerServiceStub(plain)
        profiles = profiler_pb2.GetSiteProfilesRequest(time_seconds=0)
        assert refusal(lambda: data.GetSiteProfiles(profiles, timeout=5))[0] == C.UNIMPLEMENTED
        tls_plain = profiler_pb2_grpc.ProfilerServiceStub(
            grpc.insecure_channel(f"127.0.0.1:{tls_port}")
        )
        assert refusal(lambda: tls_plain.GetSiteProfiles(profiles, timeout=5))[0] == C.UNAVAILABLE
        health.enter_graceful_shutdown()  # the drain shows on the health port too
        assert check(request, timeout=5).status == serving.NOT_SERVING
    finally:
        server.stop(grace=None)
