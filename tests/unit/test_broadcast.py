"""The aggregator encodes the global model once per round and every worker's stream replays that
one encoding: same header, chunks and checksum for all, one encoded copy held while the round's
broadcasts run and none after. Workers here are a real gRPC server (over a real socket) that
reads each StartRound stream with the workers' own receiver, checksum included."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from powertrip.services.aggregator import executor as executor_module
from powertrip.services.aggregator.delta_inbox import DeltaInbox
from powertrip.services.aggregator.executor import EncodedModel, GrpcRoundExecutor
from powertrip.services.aggregator.registry import WorkerRegistry
from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.grpc_server import build_server
from powertrip.services.common.tensor_receiver import TensorStreamReceiver
from powertrip.services.common.tensor_stream import encode, wrap_tensor_stream
from powertrip.sites.profiles import SiteProfile, site_index
from powertrip.v1 import worker_pb2, worker_pb2_grpc

CFG = ServiceConfig(insecure=True)
WORKERS = {"w0": [0, 1], "w1": [2], "w2": [3, 4], "w3": [5]}


def model(seed: int) -> dict[str, np.ndarray]:
    """Big enough for several chunks at the default chunk size (2 MiB)."""
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((1200, 1000)).astype(np.float32),
        "b": rng.standard_normal(1000).astype(np.float32),
    }


class RecordingWorker(worker_pb2_grpc.WorkerServiceServicer):
    """Receives each round like a worker (validated, checksummed) and records what arrived."""

    def __init__(self) -> None:
        self.received: list[tuple[int, tuple[int, ...], dict[str, np.ndarray]]] = []
        self._lock = threading.Lock()

    def StartRound(self, request_iterator, context):  # noqa: N802 - gRPC method name
        spec = next(request_iterator).spec
        with TensorStreamReceiver() as rx:
            rx.consume(request_iterator)  # raises on a bad chunk or checksum
            arrays = rx.arrays()
        with self._lock:
            sites = tuple(site_index(s) for s in spec.site_ids)
            self.received.append((spec.round, sites, arrays))
        return worker_pb2.StartRoundResponse()


@pytest.fixture(scope="module")
def worker_address():
    servicer = RecordingWorker()
    server, port, _ = build_server(
        [lambda s: worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, s)],
        "127.0.0.1:0",
        CFG,
    )
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(grace=None)


@pytest.fixture
def executor(worker_address, monkeypatch):
    """An executor whose workers all live at the recording server; ``encodes`` counts how often
    the model is encoded."""
    address, servicer = worker_address
    servicer.received.clear()
    registry = WorkerRegistry(num_sites=7)
    for wid, sites in WORKERS.items():
        registry.register(wid, address, sites)
    calls = []

    def counting_encode(params, chunk_bytes):
        calls.append(chunk_bytes)
        return encode(params, chunk_bytes)

    monkeypatch.setattr(executor_module, "encode", counting_encode)
    ex = GrpcRoundExecutor(registry, model(0), lambda p: (0.0, 0.0), 7, 1.0, False, CFG)
    ex.encodes = calls
    yield ex, servicer
    ex.close()


def assert_every_worker_got(servicer: RecordingWorker, params: dict[str, np.ndarray]) -> None:
    assert sorted(sites for _, sites, _ in servicer.received) == sorted(
        tuple(s) for s in WORKERS.values()
    )
    for _, _, arrays in servicer.received:
        assert arrays.keys() == params.keys()
        assert all(np.array_equal(arrays[k], params[k]) for k in params)


def test_a_round_encodes_the_model_once_for_all_workers_and_releases_it_at_round_end(executor):
    ex, servicer = executor
    profile = SiteProfile(np.ones(6), np.zeros(6), np.zeros(6))
    selected = np.arange(6, dtype=np.int64)

    assert ex.execute(1, selected, profile, split_half=False) is None  # no worker sends updates
    assert ex.failure == (1, "no_update")
    assert len(ex.encodes) == 1  # four workers, one encoding
    assert_every_worker_got(servicer, ex.params)
    assert ex._encoded is None  # nothing model-sized is kept between rounds

    servicer.received.clear()
    ex.params = model(1)  # the next round's model
    ex.execute(2, selected, profile, split_half=False)
    assert len(ex.encodes) == 2
    assert_every_worker_got(servicer, ex.params)
    assert {r for r, _, _ in servicer.received} == {2}


def test_send_round_shares_one_encoding_per_model_as_curtailment_sub_rounds_use_it(executor):
    ex, servicer = executor
    first, second = model(2), model(3)
    for params, round_index in ((first, 1), (second, 2)):
        inbox = DeltaInbox(round_index, range(6))
        for wid, sites in WORKERS.items():  # sequential, as GrpcLearner.train_sites sends
            spec = worker_pb2.StartRoundRequest().spec
            spec.round = round_index
            spec.site_ids.extend(f"site-{s:03d}" for s in sites)
            ex.send_round(inbox, wid, sites, spec, params)
        assert not inbox.failed
    assert len(ex.encodes) == 2  # one per model, not one per worker
    by_round = {1: first, 2: second}
    for round_index, _, arrays in servicer.received:
        want = by_round[round_index]
        assert all(np.array_equal(arrays[k], want[k]) for k in want)
    assert ex._encoded is not None and ex._encoded.params is second  # only the latest is held
    ex.release_broadcast()
    assert ex._encoded is None


def test_concurrent_streams_replay_exactly_the_messages_one_encoding_makes():
    params = model(4)
    want = [
        m.SerializeToString()
        for m in wrap_tensor_stream(encode(params, 1 << 16), worker_pb2.StartRoundRequest)
    ]
    shared = EncodedModel(params, chunk_bytes=1 << 16)  # many small chunks: streams interleave
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: [m.SerializeToString() for m in shared], range(8)))
    assert len(want) > 50
    assert all(g == want for g in got)
    assert shared.total_bytes == sum(a.nbytes for a in params.values())


def test_an_encoding_error_reaches_every_stream_instead_of_a_truncated_model():
    shared = EncodedModel({"x": np.array(["a", "b"], dtype=object)})  # fails at its 1st chunk
    for _ in range(2):
        with pytest.raises(TypeError):
            list(shared)


def test_a_worker_that_is_down_fails_its_sites_without_stopping_the_others(executor):
    ex, servicer = executor
    ex.registry.register("w9", "127.0.0.1:1", [6])  # nothing listens there
    inbox = DeltaInbox(1, range(7))
    for wid, sites in {"w0": [0, 1], "w9": [6]}.items():
        spec = worker_pb2.StartRoundRequest().spec
        spec.round = 1
        ex.send_round(inbox, wid, sites, spec, ex.params)
    assert inbox.failed == {6: "start_unavailable"}
    assert len(ex.encodes) == 1 and len(servicer.received) == 1
