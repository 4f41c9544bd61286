"""The profiler service: trace-driven power identical to the emulator's, link probes that are
smoothed, re-measured on demand and bounded by a byte budget, and the probe share report.

Everything runs over real gRPC on loopback (servers on port 0), in process.
"""

from __future__ import annotations

import logging
import threading

import grpc
import numpy as np
import pytest

from powertrip.config.experiment import build_config
from powertrip.services.common.config import ConfigError, load_config
from powertrip.services.common.grpc_server import build_server
from powertrip.services.netem.latency import latency_path_message
from powertrip.services.profiler import metrics
from powertrip.services.profiler.catalogue import SiteCatalogue
from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.profiler.links import LinkEstimate
from powertrip.services.profiler.probe_budget import (
    ProbeBudget,
    probe_share,
    probe_share_from_metrics,
)
from powertrip.services.profiler.probes import probe_worker
from powertrip.services.profiler.servicer import LinkProber, ProfilerServicer
from powertrip.services.worker.servicer import WorkerServicer
from powertrip.sites.profiles import ModelledLinks, profile_at, site_id
from powertrip.study.powertrip import study_sites
from powertrip.v1 import profiler_pb2, profiler_pb2_grpc, worker_pb2_grpc
from tests.needs import real_data_reason

PLAIN = {"POWERTRIP_INSECURE": "1"}  # these tests are about other settings
TIMES_S = (0.0, 299.0, 300.0, 3_600.0, 43_200.0, 86_400.0 * 7.5)


@pytest.fixture
def serve():
    """serve(register) -> "127.0.0.1:port"; every server is stopped at teardown."""
    servers = []

    def start(register) -> str:
        server, port, _ = build_server([register], "127.0.0.1:0", ProfilerConfig(insecure=True))
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(grace=None)


@pytest.fixture
def worker_address(serve) -> str:
    """A worker that answers link probes (Ping, ProbeBandwidth); it never trains here."""
    servicer = WorkerServicer(runner=None, hosted=[])  # type: ignore[arg-type]
    return serve(lambda s: worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, s))


def profiler_stub(serve, cfg: ProfilerConfig, prober: LinkProber | None = None):
    servicer = ProfilerServicer(SiteCatalogue(cfg), prober or LinkProber(cfg))
    address = serve(lambda s: profiler_pb2_grpc.add_ProfilerServiceServicer_to_server(servicer, s))
    channel = grpc.insecure_channel(address)
    return profiler_pb2_grpc.ProfilerServiceStub(channel), servicer


# ------------------------------------------------------------------ power: profiler == emulator


@pytest.mark.parametrize("model", ["synthetic-trace", "uniform", "google-trace"])
@pytest.mark.parametrize("site_seed", [0, 7])
def test_profiler_serves_the_emulators_power_at_every_time(serve, shared_data, model, site_seed):
    trace = {}
    if model == "google-trace":
        trace = {"power_trace_path": shared_data / "google-power"}
        if not trace["power_trace_path"].is_dir():
            pytest.skip(real_data_reason("google-power"))
    same = {"num_sites": 30, "site_seed": site_seed, "power_model": model, **trace}
    exp = build_config("paper-traces", **same)
    sites, power, label = study_sites(exp)
    stub, _ = profiler_stub(serve, ProfilerConfig(insecure=True, **same))

    served = []
    for t in TIMES_S:
        reply = stub.GetSiteProfiles(profiler_pb2.GetSiteProfilesRequest(time_seconds=t))
        expected = profile_at(sites, power, ModelledLinks(sites), t, exp.update_bytes).power
        got = np.array([p.power_fraction for p in reply.sites])
        assert [p.site_id for p in reply.sites] == [site_id(i) for i in range(30)]
        np.testing.assert_array_equal(got, expected)
        assert {p.power_source for p in reply.sites} == {label}
        served.append(got)

    assert label.startswith(model)
    moved = np.ptp(np.stack(served), axis=0).max()
    if model == "uniform":
        assert moved == 0.0  # the paper's controlled setting: P_i fixed for the run
    else:
        assert moved > 0.01  # trace-driven: the served power changes with the clock


def test_the_power_source_label_names_the_model(serve, shared_data):
    stub, _ = profiler_stub(
        serve, ProfilerConfig(insecure=True, num_sites=3, power_model="synthetic-trace")
    )
    reply = stub.GetSiteProfiles(profiler_pb2.GetSiteProfilesRequest(time_seconds=0))
    assert reply.sites[0].power_source == "synthetic-trace"

    stub, _ = profiler_stub(serve, ProfilerConfig(insecure=True, num_sites=3))
    reply = stub.GetSiteProfiles(profiler_pb2.GetSiteProfilesRequest(time_seconds=0))
    assert reply.sites[0].power_source == "uniform U(0.1, 1)"

    trace_dir = shared_data / "google-power"
    if trace_dir.is_dir():
        cfg = ProfilerConfig(
            insecure=True, num_sites=3, power_model="google-trace", power_trace_path=trace_dir
        )
        stub, _ = profiler_stub(serve, cfg)
        reply = stub.GetSiteProfiles(profiler_pb2.GetSiteProfilesRequest(time_seconds=0))
        assert reply.sites[0].power_source == "google-trace (measured_power_util, 5 domains)"


def test_power_model_comes_from_the_environment(tmp_path):
    cfg = load_config(
        ProfilerConfig,
        {"POWERTRIP_POWER_MODEL": "synthetic-trace", "POWERTRIP_NUM_SITES": "4", **PLAIN},
    )
    assert cfg.power_model == "synthetic-trace" and cfg.power_trace_path is None

    trace = tmp_path / "t.csv"
    trace.write_text("x")
    cfg = load_config(
        ProfilerConfig,
        {
            "POWERTRIP_POWER_MODEL": "google-trace",
            "POWERTRIP_POWER_TRACE_PATH": str(trace),
            **PLAIN,
        },
    )
    assert cfg.power_trace_path == trace


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"POWERTRIP_POWER_MODEL": "google-trace"}, "POWERTRIP_POWER_TRACE_PATH go together"),
        ({"POWERTRIP_POWER_TRACE_PATH": "/tmp"}, "POWERTRIP_POWER_MODEL=google-trace and"),
        (
            {"POWERTRIP_POWER_MODEL": "google-trace", "POWERTRIP_POWER_TRACE_PATH": "/no/such"},
            "/no/such does not exist",
        ),
        ({"POWERTRIP_POWER_MODEL": "solar"}, "POWERTRIP_POWER_MODEL='solar'"),
    ],
)
def test_a_bad_power_setting_is_one_error_naming_the_variables(env, message):
    with pytest.raises(ConfigError, match=message):
        load_config(ProfilerConfig, {**env, **PLAIN})


# ------------------------------------------------------------------------------- link probes


def test_probe_measures_rtt_and_bandwidth_of_a_worker_on_loopback(worker_address):
    cfg = ProfilerConfig(insecure=True, ping_count=5, probe_bytes=2 << 20)
    prober = LinkProber(cfg)
    prober.track("w1", worker_address, [0, 1])
    before = metrics.PROBE_BYTES._value.get()

    prober.measure()

    link = prober.link("w1")
    assert link.probes == 1 and link.bandwidth_probes == 1
    assert 0 < link.rtt_s < 0.1
    assert link.bandwidth_bytes_per_s > 10e6  # loopback moves far more than 10 MB/s
    assert set(prober.links_by_site()) == {0, 1}
    # every payload byte counted: the bulk stream plus (1 warm-up + 5) pings of 64 B each way
    assert metrics.PROBE_BYTES._value.get() - before == (2 << 20) + 2 * 64 * 6


def test_one_shot_probe_with_zero_bytes_measures_the_rtt_alone(worker_address):
    stub = worker_pb2_grpc.WorkerServiceStub(grpc.insecure_channel(worker_address))
    pings = probe_worker(stub, ping_count=3, probe_bytes=0, timeout_s=5)
    full = probe_worker(stub, ping_count=3, probe_bytes=1 << 20, timeout_s=5)
    assert pings.bandwidth_bytes_per_s is None and pings.bytes_moved == 2 * 64 * 4
    assert full.bandwidth_bytes_per_s > 0 and full.bytes_moved == (1 << 20) + 2 * 64 * 4
    assert pings.rtt_s > 0 and full.rtt_s > 0


def test_measure_links_on_demand_returns_fresh_links_and_the_requested_times_power(
    serve, worker_address
):
    cfg = ProfilerConfig(
        insecure=True, num_sites=4, power_model="synthetic-trace", probe_bytes=1 << 20
    )
    stub, servicer = profiler_stub(serve, cfg)
    stub.TrackWorker(
        profiler_pb2.TrackWorkerRequest(
            worker_id="w", address=worker_address, site_ids=[site_id(2)]
        )
    )

    reply = stub.MeasureLinks(profiler_pb2.MeasureLinksRequest(time_seconds=50_000.0))

    measured = {p.site_id: p for p in reply.sites if p.rtt_seconds > 0}
    assert set(measured) == {site_id(2)}
    assert measured[site_id(2)].bandwidth_bytes_per_second > 0
    np.testing.assert_array_equal(
        [p.power_fraction for p in reply.sites], servicer.catalogue.power.power_at(50_000.0)
    )
    assert servicer.prober.link("w").probes >= 1  # TrackWorker's own probe may have run too


def test_measure_links_names_an_unknown_worker(serve):
    stub, _ = profiler_stub(serve, ProfilerConfig(insecure=True, num_sites=2))
    with pytest.raises(grpc.RpcError) as err:
        stub.MeasureLinks(profiler_pb2.MeasureLinksRequest(worker_ids=["ghost"]))
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert "ghost" in err.value.details()


def test_periodic_probing_re_measures_every_interval(worker_address):
    prober = LinkProber(
        ProfilerConfig(insecure=True, probe_interval_s=0.05, ping_count=1, probe_bytes=1 << 16)
    )
    prober.track("w", worker_address, [0])
    thread = threading.Thread(target=prober.run_periodically, daemon=True)
    thread.start()
    try:
        deadline = 100
        while prober.link("w").probes < 3 and deadline:
            threading.Event().wait(0.05)
            deadline -= 1
    finally:
        prober.stop()
        thread.join(timeout=5)
    assert prober.link("w").probes >= 3
    assert not thread.is_alive()


def test_over_budget_probes_keep_the_bandwidth_estimate_and_still_measure_rtt(
    worker_address, caplog
):
    cfg = ProfilerConfig(insecure=True, ping_count=3, probe_bytes=1 << 20)
    now = [0.0]
    budget = ProbeBudget(int(1.5 * (1 << 20)), clock=lambda: now[0])  # room for one bulk probe
    prober = LinkProber(cfg, budget=budget)
    prober.track("w", worker_address, [0])
    over = metrics.PROBES.labels("over_budget")._value.get()

    prober.measure()
    first_bw = prober.link("w").bandwidth_bytes_per_s
    with caplog.at_level(logging.WARNING, logger="powertrip.services.profiler.servicer"):
        prober.measure()

    link = prober.link("w")
    assert link.probes == 2 and link.bandwidth_probes == 1
    assert link.bandwidth_bytes_per_s == first_bw
    assert metrics.PROBES.labels("over_budget")._value.get() == over + 1
    assert "probe budget" in caplog.text and "pings only" in caplog.text

    now[0] = 3_601.0  # an hour later the first probe's bytes have left the window
    prober.measure()
    assert prober.link("w").bandwidth_probes == 2


def test_budget_is_a_trailing_window():
    now = [0.0]
    budget = ProbeBudget(100, window_s=10.0, clock=lambda: now[0])
    assert budget.try_spend(60) and not budget.try_spend(41) and budget.try_spend(40)
    assert budget.used() == 100
    now[0] = 9.9
    assert not budget.try_spend(1)
    now[0] = 10.0
    assert budget.used() == 0 and budget.try_spend(100)
    with pytest.raises(ValueError):
        ProbeBudget(-1)


def test_link_estimate_smooths_and_keeps_bandwidth_when_only_pinged():
    est = LinkEstimate(smoothing=0.25)
    est.update(0.040, 1_000.0, now_s=1.0)
    assert (est.rtt_s, est.bandwidth_bytes_per_s) == (0.040, 1_000.0)  # first probe is taken whole
    est.update(0.080, 2_000.0, now_s=2.0)
    assert est.rtt_s == pytest.approx(0.050) and est.bandwidth_bytes_per_s == pytest.approx(1_250)
    est.update(0.050, None, now_s=3.0)
    assert est.bandwidth_bytes_per_s == pytest.approx(1_250) and est.measured_at_s == 3.0
    fresh = LinkEstimate()
    fresh.update(0.01, None, 0.0)
    fresh.update(0.01, 500.0, 1.0)
    assert fresh.bandwidth_bytes_per_s == 500.0  # the first bandwidth is not averaged with 0


# -------------------------------------------------------------------------------- probe share


def test_probe_share_is_probe_bytes_over_all_bytes_moved():
    assert probe_share(10, 60, 30) == pytest.approx(0.1)
    assert probe_share(0, 0, 0) == 0.0
    assert probe_share(5, 0, 0) == 1.0
    with pytest.raises(ValueError):
        probe_share(-1, 0, 0)


def test_probe_share_from_the_services_metrics_text():
    profiler = (
        "# TYPE powertrip_probe_bytes_total counter\npowertrip_probe_bytes_total 2.0e6\n"
        '# TYPE powertrip_probes_total counter\npowertrip_probes_total{outcome="ok"} 4\n'
    )
    aggregator = (
        "# TYPE powertrip_update_bytes_total counter\n"
        'powertrip_update_bytes_total{site="site-0",direction="up"} 5.0e6\n'
        'powertrip_update_bytes_total{site="site-1",direction="up"} 5.0e6\n'
        "# TYPE powertrip_model_broadcast_bytes_total counter\n"
        'powertrip_model_broadcast_bytes_total{worker="w"} 8.0e6\n'
    )
    assert probe_share_from_metrics(profiler, aggregator) == pytest.approx(2 / 20)


def test_latency_path_message_never_pretends_netem():
    assert "no netem" in latency_path_message(False)
    assert "application-level relay" in latency_path_message(False)
    assert "cannot be checked" in latency_path_message(None)
    assert "netem is available" in latency_path_message(True)
