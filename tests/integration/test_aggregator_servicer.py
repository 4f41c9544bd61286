"""AggregatorService on a real server bound to port 0: bad registrations and bad updates get
their status code and a message naming the problem, and the round goes on with the others."""

from __future__ import annotations

from dataclasses import replace

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from powertrip.aggregation.robust import Aggregation
from powertrip.services.aggregator.collector import RoundCollector
from powertrip.services.worker.sites_host import SiteUpdate
from powertrip.services.worker.uploader import update_messages
from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc
from tests.aggregator_in_process import serve, small_run

SERVICE = "powertrip.v1.AggregatorService"
ROUND = 3
C = grpc.StatusCode


@pytest.fixture(scope="module")
def run():
    return small_run(POWERTRIP_INSECURE="1")


@pytest.fixture
def stub(run):
    server, port = serve(run)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield aggregator_pb2_grpc.AggregatorServiceStub(channel), channel
    server.stop(grace=None)


def register(stub, worker_id, sites, address="127.0.0.1:9"):
    return stub.RegisterWorker(
        aggregator_pb2.RegisterWorkerRequest(worker_id=worker_id, address=address, site_ids=sites),
        timeout=5,
    )


def code_of(call):
    with pytest.raises(grpc.RpcError) as exc:
        call()
    return exc.value.code(), exc.value.details()


def delta(run, value: float, **changes):
    d = {k: np.full(v.shape, value, dtype=v.dtype) for k, v in run.executor.params.items()}
    d.update(changes)
    return d


def submit(stub, run, site, value=0.01, round_index=ROUND, worker="w-a", samples=10.0, **chg):
    update = SiteUpdate(site, delta(run, value, **chg), samples, 0.1)
    return stub.SubmitUpdate(update_messages(worker, round_index, update, 4096), timeout=10)


def test_health_check_reports_serving(stub):
    _, channel = stub
    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_registration_hands_out_the_run_configuration(stub, run):
    s, _ = stub
    reply = register(s, "w-a", ["site-000", "site-001"])
    assert '"num_sites":4' in reply.run_config_json
    assert reply.run_seed == run.run_seed
    # a restarted worker re-registers under the same id without error
    register(s, "w-a", ["site-000", "site-001"], address="127.0.0.1:10")


@pytest.mark.parametrize(
    ("worker", "sites", "code", "words"),
    [
        ("", ["site-000"], C.INVALID_ARGUMENT, "worker_id"),
        ("w-x", ["bogus"], C.INVALID_ARGUMENT, "bad site id"),
        ("w-x", ["site-009"], C.NOT_FOUND, "site-009"),
        ("w-x", [], C.INVALID_ARGUMENT, "no site"),
    ],
)
def test_bad_registrations_are_refused_with_a_reason(stub, worker, sites, code, words):
    s, _ = stub
    got, details = code_of(lambda: register(s, worker, sites))
    assert got == code and words in details


def test_a_site_hosted_elsewhere_cannot_be_claimed(stub):
    s, _ = stub
    register(s, "w-a", ["site-000", "site-001"])
    got, details = code_of(lambda: register(s, "w-b", ["site-001"]))
    assert got == C.ALREADY_EXISTS and "w-a" in details


@pytest.mark.reliability("R2", "R11", "R12", "R17")
def test_bad_updates_are_rejected_and_the_round_continues_with_the_others(stub, run):
    s, _ = stub
    register(s, "w-a", ["site-000", "site-001"])
    register(s, "w-b", ["site-002"])
    template = run.executor.params
    collector = RoundCollector(ROUND, [0, 1, 2], template)
    run.executor.collector = collector
    name = next(iter(template))
    bad = [
        # (what, call, code, words in the message)
        ("unknown site", {"site": 3, "worker": "w-b"}, C.NOT_FOUND, "site-003"),
        ("wrong round", {"site": 0, "round_index": ROUND + 1}, C.FAILED_PRECONDITION, "round"),
        (
            "wrong shape",
            dict(site=0, **{name: np.zeros((1, 2), np.float32)}),
            C.INVALID_ARGUMENT,
            "shape",
        ),
        (
            "wrong dtype",
            dict(site=0, **{name: template[name].astype(np.float64)}),
            C.INVALID_ARGUMENT,
            "dtype",
        ),
        ("not its worker", {"site": 2, "worker": "w-a"}, C.INVALID_ARGUMENT, "hosted by"),
        ("zero weight", {"site": 0, "samples": 0.0}, C.INVALID_ARGUMENT, "weight"),
        ("infinite weight", {"site": 0, "samples": float("inf")}, C.INVALID_ARGUMENT, "finite"),
    ]
    for what, kwargs, code, words in bad:
        got, details = code_of(lambda kw=kwargs: submit(s, run, **kw))
        assert (got, words in details) == (code, True), (what, got, details)
    # NaN from site 1: that site is dropped, the round keeps going
    nan = template[name].copy()
    nan.reshape(-1)[-1] = np.nan
    got, details = code_of(lambda: submit(s, run, site=1, **{name: nan}))
    assert got == C.INVALID_ARGUMENT and "NaN" in details
    # good updates from the other two sites are accepted; a replay is refused
    assert submit(s, run, site=0, value=0.01).accepted
    assert submit(s, run, site=2, value=0.03, worker="w-b").accepted
    got, _ = code_of(lambda: submit(s, run, site=0, value=0.01))
    assert got == C.ALREADY_EXISTS
    collector.close()
    assert collector.accepted == [0, 2]
    assert collector.failed == {1: "non_finite"}
    expected = Aggregation().make(template)  # the default rule, as the collector folds
    expected.add(delta(run, 0.01), 10.0)
    expected.add(delta(run, 0.03), 10.0)
    got_model = collector.agg.apply(template)
    want_model = expected.apply(template)
    assert all(np.array_equal(got_model[k], want_model[k]) for k in template)
    # after the round closed, a late update is stale
    got, details = code_of(lambda: submit(s, run, site=2, worker="w-b"))
    assert got == C.FAILED_PRECONDITION and "closed" in details


@pytest.mark.reliability("R9")
def test_a_stream_with_a_wrong_checksum_is_rejected(stub, run):
    s, _ = stub
    register(s, "w-a", ["site-000", "site-001"])
    run.executor.collector = RoundCollector(ROUND, [0], run.executor.params)
    update = SiteUpdate(0, delta(run, 0.5), 10.0, 0.1)
    msgs = list(update_messages("w-a", ROUND, update, 4096))
    msgs[-1] = aggregator_pb2.SubmitUpdateRequest(
        trailer=replace_trailer(msgs[-1].trailer, "0" * 32)
    )
    got, details = code_of(lambda: s.SubmitUpdate(iter(msgs), timeout=10))
    assert got == C.INVALID_ARGUMENT and "checksum" in details
    # a dropped chunk is caught by its offset
    msgs = list(update_messages("w-a", ROUND, replace(update, site=1), 4096))
    del msgs[3]
    run.executor.collector = RoundCollector(ROUND, [1], run.executor.params)
    got, details = code_of(lambda: s.SubmitUpdate(iter(msgs), timeout=10))
    assert got == C.INVALID_ARGUMENT and "offset" in details


def replace_trailer(trailer, digest):
    out = type(trailer)()
    out.CopyFrom(trailer)
    out.xxh3_128 = digest
    return out
