"""Update codecs on the real wire: a real AggregatorService on a real socket, whose run assigns
the codec, and the worker's ``GrpcUploader`` sending updates its host coded with it. int8 sends
about a quarter of the chunk bytes of codec none and folds exactly its decoding; a payload
larger than the codec's exact layout, or coded with another codec, is refused naming the site
and the field while the round commits the other sites."""

from __future__ import annotations

from dataclasses import replace

import grpc
import numpy as np
import pytest

from powertrip.aggregation.fedavg import StreamingFedAvg
from powertrip.codecs import ErrorFeedback, get_codec, roundtrip
from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.state_book import round_key
from powertrip.services.aggregator.service_handlers import add_to_server
from powertrip.services.aggregator.servicer import AggregatorServicer
from powertrip.services.common.grpc_server import build_server, set_serving
from powertrip.services.worker.sites_host import SiteUpdate
from powertrip.services.worker.state_dir import WorkerBook
from powertrip.services.worker.uploader import GrpcUploader, shard_updates, update_messages
from powertrip.v1 import aggregator_pb2_grpc
from tests.aggregator_in_process import SERVICE, small_run
from tests.integration.test_aggregator_servicer import C, code_of, register

ROUND = 2


def counting_server(run, chunk_bytes: list[int]):
    """``run``'s service on a real socket, counting every chunk's bytes that reach it."""
    servicer = AggregatorServicer(run)
    inner = servicer._submit

    def submit(requests, context):
        def counted():
            for m in requests:
                if m.WhichOneof("part") == "chunk":
                    chunk_bytes.append(len(m.chunk.data))
                yield m

        return inner(counted(), context)

    servicer._submit = submit
    server, port, health = build_server(
        [lambda s: add_to_server(servicer, s)], "127.0.0.1:0", run.cfg, [SERVICE]
    )
    server.start()
    set_serving(health, [SERVICE], True)
    return server, grpc.insecure_channel(f"127.0.0.1:{port}")


@pytest.fixture(scope="module", params=["none", "int8"])
def served(request):
    run = small_run(POWERTRIP_INSECURE="1", POWERTRIP_CODEC=request.param)
    counted: list[int] = []
    server, channel = counting_server(run, counted)
    yield request.param, run, channel, counted
    channel.close()
    server.stop(grace=None)


def site_update(run, site: int) -> SiteUpdate:
    rng = np.random.default_rng(site)
    delta = {
        k: (rng.standard_normal(v.shape) * 0.01).astype(np.float32)
        for k, v in run.executor.params.items()
    }
    return SiteUpdate(site, delta, float(run.executor.site_weights[site]), 0.1)


def leaving(update: SiteUpdate, codec: str) -> SiteUpdate:
    """``update`` as a host hands it to the uploader under the run's ``codec``."""
    if codec == "none":
        return update
    feedback = ErrorFeedback(get_codec(codec))
    return replace(update, delta=feedback.encode(update.site, update.delta), codec=codec)


@pytest.fixture
def open_round(served):
    codec, run, channel, counted = served
    stub = aggregator_pb2_grpc.AggregatorServiceStub(channel)
    register(stub, "w-a", ["site-000", "site-001"])
    register(stub, "w-b", ["site-002", "site-003"])
    collector = run.executor.open_round(ROUND, [0, 1, 2])
    counted.clear()
    yield codec, run, channel, stub, collector, counted
    collector.close()
    run.executor.collector = None


WIRE: dict[str, int] = {}


def test_the_assigned_codec_crosses_the_wire_and_folds_its_decoding(open_round):
    codec, run, channel, _, collector, counted = open_round
    uploader = GrpcUploader(channel, "w-a", 4096)
    for site in (0, 1):
        uploader(ROUND, leaving(site_update(run, site), codec), timeout_s=20)
    other = GrpcUploader(channel, "w-b", 4096)
    other(ROUND, leaving(site_update(run, 2), codec), timeout_s=20)
    assert collector.wait(5)
    collector.close()
    assert collector.accepted == [0, 1, 2] and collector.failed == {}
    ref = StreamingFedAvg(run.executor.params)
    for site in (0, 1, 2):
        u = site_update(run, site)
        sent = {k: roundtrip(get_codec(codec), v)[0] for k, v in u.delta.items()}
        ref.add(sent, u.num_samples)
    want, got = ref.apply(run.executor.params), collector.agg.apply(run.executor.params)
    assert all(np.allclose(got[k], want[k], rtol=0, atol=1e-7) for k in want)
    WIRE[codec] = sum(counted)
    fp32 = 3 * 4 * sum(v.size for v in run.executor.params.values())
    if codec == "none":
        assert WIRE[codec] == fp32  # the raw stream, as before codecs
    else:  # int8: n + 4 ceil(n / 256) bytes per tensor of n entries
        assert 0.25 < WIRE[codec] / fp32 < 0.26
    if len(WIRE) == 2:
        print(f"int8 / none chunk bytes: {WIRE['int8'] / WIRE['none']:.4f}")


def test_a_sites_per_rank_shards_coded_by_its_host_fold_as_its_whole_update(open_round):
    """A site trained over four ranks: its host codes each rank's shard on its own (one
    residual for the site) and sends four streams naming the run's codec; the aggregator decodes
    each shard and folds the site as the whole-update path folds it: exactly under codec none,
    within int8's rounding under int8 (a block of a shard is not a block of the whole tensor)."""
    codec, run, channel, _, collector, _ = open_round
    params = run.executor.params
    shapes = {k: tuple(v.shape) for k, v in params.items()}
    book = WorkerBook(LocalOptimizer(), shapes, keeps=False, codec=codec)
    whole = site_update(run, 0)
    ranks = replace(whole, shards=[u.delta for u in shard_updates(whole, 4)])
    (sent,) = book.leaving([ranks], round_key(ROUND), ROUND)
    assert sent.shards is not None and len(sent.shards) == 4
    assert sent.codec == ("" if codec == "none" else codec)
    GrpcUploader(channel, "w-a", 4096)(ROUND, sent, timeout_s=20)
    GrpcUploader(channel, "w-a", 4096)(ROUND, leaving(site_update(run, 1), codec), 20)
    GrpcUploader(channel, "w-b", 4096)(ROUND, leaving(site_update(run, 2), codec), 20)
    assert collector.wait(5)
    collector.close()
    assert collector.accepted == [0, 1, 2] and collector.failed == {}
    ref = StreamingFedAvg(params)
    for site in (0, 1, 2):
        u = site_update(run, site)
        ref.add({k: roundtrip(get_codec(codec), v)[0] for k, v in u.delta.items()}, u.num_samples)
    want, got = ref.apply(params), collector.agg.apply(params)
    largest = max(float(np.abs(v).max()) for v in whole.delta.values())
    rounding = 0.0 if codec == "none" else largest / 127  # each block's scale is below it
    assert all(np.allclose(got[k], want[k], rtol=0, atol=rounding + 1e-7) for k in want)


def coded(run, site: int, name: str) -> SiteUpdate:
    u = site_update(run, site)
    return replace(u, delta=ErrorFeedback(get_codec(name), enabled=False).encode(site, u.delta))


def oversized(run, site: int) -> SiteUpdate:
    u = coded(run, site, "int8")
    key = next(k for k in u.delta if k.endswith("#codes"))
    u.delta[key] = np.concatenate([u.delta[key], np.ones(1 << 16, np.int8)])  # 64 KiB more
    return u


@pytest.mark.parametrize(
    ("attempt", "words"),
    [
        (lambda run: (coded(run, 0, "int4"), "int4"), ["site-000", "codec", "'int4'", "'int8'"]),
        (lambda run: (site_update(run, 0), ""), ["site-000", "codec", "'none'", "'int8'"]),
        (lambda run: (oversized(run, 0), "int8"), ["site-000", "#codes", "shape"]),
    ],
    ids=["another-codec", "raw-fp32", "larger-than-the-bound"],
)
def test_a_payload_off_the_codecs_layout_is_refused_and_the_round_goes_on(
    open_round, attempt, words
):
    codec, run, channel, stub, collector, _ = open_round
    if codec != "int8":
        pytest.skip("the int8 run's refusals")
    update, name = attempt(run)
    messages = update_messages("w-a", ROUND, update, 4096, codec=name)
    code, details = code_of(lambda: stub.SubmitUpdate(messages, timeout=10))
    assert code == C.INVALID_ARGUMENT
    assert all(w in details for w in words), details
    for site, worker in ((1, "w-a"), (2, "w-b")):
        GrpcUploader(channel, worker, 4096)(ROUND, leaving(site_update(run, site), "int8"), 20)
    assert collector.wait(5)
    collector.close()
    assert collector.accepted == [1, 2] and 0 in collector.failed
