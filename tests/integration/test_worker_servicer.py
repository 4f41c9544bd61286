"""WorkerService on a real server bound to port 0: rounds are validated in the handler and
trained on the worker's own thread; link probes answer within bounds."""

from __future__ import annotations

import queue
import threading
import time

import grpc
import numpy as np
import pytest

from powertrip.config.experiment import build_config
from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.grpc_server import build_server
from powertrip.services.common.tensor_stream import encode, wrap_tensor_stream
from powertrip.services.worker.runner import RoundJob, RoundRunner, release_delays
from powertrip.services.worker.servicer import WorkerServicer
from powertrip.services.worker.sites_host import SitesHost, SiteUpdate
from powertrip.v1 import common_pb2, worker_pb2, worker_pb2_grpc

C = grpc.StatusCode
HOSTED = [0, 1]


@pytest.fixture(scope="module")
def host():
    cfg = build_config("quick", num_sites=4, num_samples=1000, target_accuracy=0.5)
    return SitesHost(cfg, run_seed=0, sites=HOSTED)


@pytest.fixture
def worker(host):
    uploads: queue.Queue = queue.Queue()

    def record(round_index, update, timeout_s):
        uploads.put((round_index, update, threading.current_thread().name))

    runner = RoundRunner(record)
    servicer = WorkerServicer(runner, HOSTED)
    server, port, _ = build_server(
        [lambda s: worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, s)],
        "127.0.0.1:0",
        ServiceConfig(insecure=True),
    )
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield worker_pb2_grpc.WorkerServiceStub(ch), runner, uploads
    runner.stop()
    server.stop(grace=None)


def round_stream(params, sites, round_index=1, deadline=30.0):
    spec = common_pb2.RoundSpec(
        round=round_index, run_seed=0, site_ids=sites, deadline_seconds=deadline
    )
    yield worker_pb2.StartRoundRequest(spec=spec)
    yield from wrap_tensor_stream(encode(params, 4096), worker_pb2.StartRoundRequest)


def error_of(call):
    with pytest.raises(grpc.RpcError) as exc:
        call()
    return exc.value.code(), exc.value.details()


def test_a_round_before_the_sites_are_loaded_is_refused_as_busy(worker, host):
    stub, _, _ = worker
    code, details = error_of(
        lambda: stub.StartRound(round_stream(host.template, ["site-000"]), timeout=5)
    )
    assert code == C.RESOURCE_EXHAUSTED and "loading" in details


def test_stream_rows_sent_to_a_partition_worker_are_refused_before_the_model(worker, host):
    stub, runner, _ = worker
    runner.start(host)

    def with_rows():
        spec = common_pb2.RoundSpec(round=1, run_seed=0, site_ids=["site-000"])
        spec.stream_rows["site-000"].positions.extend([0, 1, 2])
        yield worker_pb2.StartRoundRequest(spec=spec)  # and no model: refused on the spec

    code, details = error_of(lambda: stub.StartRound(with_rows(), timeout=5))
    assert code == C.INVALID_ARGUMENT and "curtailment-mode" in details


def test_a_round_for_a_site_hosted_elsewhere_is_not_found(worker, host):
    stub, runner, _ = worker
    runner.start(host)
    code, details = error_of(
        lambda: stub.StartRound(round_stream(host.template, ["site-003"]), timeout=5)
    )
    assert code == C.NOT_FOUND and "site-003" in details


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        (lambda p: iter([]), "round spec"),
        (lambda p: list(round_stream(p, ["site-000"]))[1:], "round spec"),
        (lambda p: list(round_stream(p, ["site-000"]))[:-1], "trailer"),
        (lambda p: list(round_stream(p, ["bogus"])), "bad site id"),
    ],
)
def test_malformed_round_streams_are_invalid(worker, host, messages, words):
    stub, runner, _ = worker
    runner.start(host)
    code, details = error_of(lambda: stub.StartRound(iter(messages(host.template)), timeout=5))
    assert code == C.INVALID_ARGUMENT and words in details


def test_training_runs_on_the_worker_thread_and_yields_one_update_per_site(worker, host):
    stub, runner, uploads = worker
    runner.start(host)
    reply = stub.StartRound(round_stream(host.template, ["site-001", "site-000"]), timeout=10)
    assert list(reply.accepted_site_ids) == ["site-001", "site-000"]
    got = [uploads.get(timeout=30) for _ in range(2)]
    assert {u.site for _, u, _ in got} == {0, 1}
    assert all(r == 1 and thread == "round-runner" for r, _, thread in got)
    for _, u, _ in got:
        assert set(u.delta) == set(host.template)
        assert u.num_samples > 0 and any(np.abs(d).sum() > 0 for d in u.delta.values())


def test_pacing_holds_a_half_power_site_twice_as_long():
    updates = [SiteUpdate(s, {}, 1.0, train_seconds=2.0) for s in (0, 1, 2)]
    assert release_delays(updates, {0: 0.5, 1: 1.0, 2: 0.25}) == [4.0, 2.0, 8.0]


def test_ping_echoes_and_bandwidth_probes_are_bounded(worker):
    stub, _, _ = worker
    assert stub.Ping(worker_pb2.PingRequest(payload=b"abc"), timeout=5).payload == b"abc"
    got = sum(
        len(m.data)
        for m in stub.ProbeBandwidth(
            worker_pb2.ProbeBandwidthRequest(total_bytes=3_000_000, chunk_bytes=1 << 20), timeout=5
        )
    )
    assert got == 3_000_000
    code, _ = error_of(
        lambda: list(
            stub.ProbeBandwidth(worker_pb2.ProbeBandwidthRequest(total_bytes=1 << 40), timeout=5)
        )
    )
    assert code == C.INVALID_ARGUMENT


def test_in_wall_clock_mode_a_half_power_site_is_released_after_twice_its_compute(host):
    released: dict[int, float] = {}
    done = threading.Event()

    def record(round_index, update, timeout_s):
        released[update.site] = time.monotonic()
        if len(released) == 2:
            done.set()

    runner = RoundRunner(record)
    runner.start(host)
    start = time.monotonic()
    runner.submit(
        RoundJob(1, [0, 1], host.template, 60.0, pace_by_power=True, power={0: 0.5, 1: 1.0})
    )
    assert done.wait(60)
    runner.stop()
    compute = min(released.values()) - start  # the full-power site leaves right after training
    assert released[1] < released[0]
    assert released[0] - start >= 2 * compute * 0.95
