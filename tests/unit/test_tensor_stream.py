"""Chunked tensor streams: exact round trips, and every broken stream named by its fault."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import xxhash

from powertrip.aggregation.robust import make_aggregator
from powertrip.services.common.tensor_receiver import TensorStreamReceiver
from powertrip.services.common.tensor_stream import (
    StreamError,
    encode,
    specs_of,
    wrap_tensor_stream,
)
from powertrip.services.worker.uploader import tensor_wire, update_messages, update_wire
from powertrip.v1 import aggregator_pb2, common_pb2


def params():
    rng = np.random.default_rng(0)
    return {
        "a": rng.standard_normal((7, 3)).astype(np.float32),  # 84 bytes: chunks straddle tensors
        "b": rng.standard_normal(5).astype(np.float64),
        "c": np.arange(6, dtype=np.int64).reshape(2, 3),
    }


def receive(parts, expected=None):
    rx = TensorStreamReceiver(expected)
    for p in parts:
        if isinstance(p, common_pb2.TensorStreamHeader):
            rx.header(p)
        elif isinstance(p, common_pb2.TensorChunk):
            rx.chunk(p)
        else:
            rx.trailer(p)
    return rx


@pytest.mark.reliability("R9")
@pytest.mark.parametrize("chunk", [1, 5, 16, 100, 1 << 20])
def test_any_chunk_size_reassembles_the_exact_tensors(chunk):
    p = params()
    parts = list(encode(p, chunk))
    assert all(len(m.data) <= chunk for m in parts if isinstance(m, common_pb2.TensorChunk))
    got = receive(parts).arrays()
    assert all(np.array_equal(got[k], p[k]) and got[k].dtype == p[k].dtype for k in p)


def test_pieces_cover_each_tensor_in_order_without_overlap():
    p = params()
    rx = receive(encode(p, 16))
    seen = dict.fromkeys(p, 0)
    for name, start, values in rx.pieces(piece_bytes=24):
        assert start == seen[name]
        seen[name] += values.size
    assert seen == {k: v.size for k, v in p.items()}


@pytest.mark.reliability("R12")
def test_a_nan_split_across_two_chunks_is_caught():
    p = params()
    p["b"][2] = np.nan  # bytes 100..107 of the stream; chunks of 5 bytes split it
    with pytest.raises(StreamError, match="'b' contains NaN") as exc:
        receive(encode(p, 5))
    assert exc.value.reason == "non_finite"


@pytest.mark.reliability("R9")
@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda parts: parts.pop(2), "sequence"),  # a missing chunk
        (lambda parts: parts.insert(2, parts[1]), "sequence"),  # a duplicated chunk
        (lambda parts: parts.__setitem__(slice(1, 3), [parts[2], parts[1]]), "sequence"),
        (lambda parts: parts.pop(-2), "truncated"),  # last chunk lost before the trailer
    ],
)
def test_broken_chunk_sequences_are_rejected(mutate, reason):
    parts = list(encode(params(), 16))
    mutate(parts)
    with pytest.raises(StreamError) as exc:
        receive(parts)
    assert exc.value.reason == reason


@pytest.mark.reliability("R12")
@pytest.mark.parametrize("chunk", [1, 3, 5, 7, 16])
@pytest.mark.parametrize(("tensor", "index"), [("a", (0, 0)), ("a", (6, 2)), ("b", 4)])
def test_a_non_finite_value_anywhere_is_caught_whatever_the_chunk_boundaries(chunk, tensor, index):
    p = params()
    p[tensor][index] = np.inf
    with pytest.raises(StreamError, match=f"'{tensor}' contains NaN or Inf"):
        receive(encode(p, chunk))


def test_the_trailer_carries_the_xxh3_128_of_the_chunk_bytes_in_order():
    parts = list(encode(params(), 16))
    data = b"".join(m.data for m in parts[1:-1])
    assert parts[-1].xxh3_128 == xxhash.xxh3_128(data).hexdigest()


@pytest.mark.reliability("R9")
def test_a_corrupted_chunk_fails_the_checksum():
    parts = list(encode(params(), 16))
    parts[2] = common_pb2.TensorChunk(offset_bytes=16, data=bytes(16))  # 2nd chunk zeroed
    with pytest.raises(StreamError, match="checksum") as exc:
        receive(parts)
    assert exc.value.reason == "checksum"


def test_expected_specs_pin_names_shapes_and_dtypes():
    p = params()
    expected = specs_of(p)
    wrong_shape = dict(p, a=np.zeros((3, 7), np.float32))
    wrong_dtype = dict(p, c=p["c"].astype(np.int32))
    missing = {k: v for k, v in p.items() if k != "b"}
    for bad, reason in [(wrong_shape, "shape"), (wrong_dtype, "dtype"), (missing, "tensor_set")]:
        with pytest.raises(StreamError) as exc:
            receive(encode(bad, 16), expected)
        assert exc.value.reason == reason


def test_unsupported_dtypes_and_oversized_streams_are_refused():
    head = common_pb2.TensorStreamHeader(
        tensors=[common_pb2.TensorSpec(name="x", shape=[2], dtype="object")], total_bytes=16
    )
    with pytest.raises(StreamError, match="unsupported dtype"):
        TensorStreamReceiver().header(head)
    big = next(iter(encode({"x": np.zeros(1000, np.float32)})))
    with pytest.raises(StreamError, match="exceeds"):
        TensorStreamReceiver(max_total_bytes=1000).header(big)


@pytest.mark.reliability("R9")
def test_a_large_stream_spills_to_disk_and_reads_back_exactly():
    p = {"w": np.arange(3 << 20, dtype=np.float32)}  # 12 MiB > the 8 MiB in-memory spool
    rx = receive(encode(p))
    assert rx._spool._rolled  # on disk, not in memory
    assert np.array_equal(rx.arrays()["w"], p["w"])
    rx.close()


def test_pieces_are_views_of_one_reused_buffer_so_a_keeper_must_copy():
    p = {"w": np.arange(64, dtype=np.float32)}
    rx = receive(encode(p, 16))
    kept = [values for _, _, values in rx.pieces(piece_bytes=32)]
    assert np.shares_memory(kept[0], kept[1])  # the documented contract: valid until the next
    copied = np.concatenate([values.copy() for _, _, values in rx.pieces(piece_bytes=32)])
    assert np.array_equal(copied, p["w"]) and np.array_equal(rx.arrays()["w"], p["w"])


@pytest.mark.reliability("R13")
def test_a_robust_rule_fed_streamed_pieces_keeps_every_update_exactly():
    rng = np.random.default_rng(1)
    template = {"w": np.zeros((6, 5), np.float32), "b": np.zeros(7, np.float32)}
    updates = [
        {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in template.items()}
        for _ in range(3)
    ]
    streamed, direct = make_aggregator("median", template), make_aggregator("median", template)
    for u in updates:
        streamed.add_pieces(receive(encode(u, 12)).pieces(piece_bytes=8), 1.0)
        direct.add(u, 1.0)
    got, want = streamed.mean_delta(), direct.mean_delta()
    assert all(np.array_equal(got[k], want[k]) for k in template)


def wide_params():
    p = params()
    p["wide"] = np.linspace(-1, 1, 40_000, dtype=np.float32)  # offsets need 3-byte varints
    return p


@pytest.mark.parametrize("chunk", [5, 100, 4096, 1 << 20])
def test_hand_built_upload_bytes_equal_what_protobuf_serializes(chunk):
    p = wide_params()
    want = [
        m.SerializeToString()
        for m in wrap_tensor_stream(encode(p, chunk), aggregator_pb2.SubmitUpdateRequest)
    ]
    got = list(tensor_wire(p, chunk))
    assert got == want
    parsed = [aggregator_pb2.SubmitUpdateRequest.FromString(b) for b in got]
    rx = TensorStreamReceiver()
    rx.consume(parsed)
    assert all(np.array_equal(rx.arrays()[k], p[k]) for k in p)


def test_the_uploader_wire_stream_is_update_messages_serialized():
    update = SimpleNamespace(
        site=3, delta=wide_params(), num_samples=12.5, train_seconds=0.25, loss=None
    )
    want = [m.SerializeToString() for m in update_messages("w-3", 7, update, 4096)]
    assert list(update_wire("w-3", 7, update, 4096)) == want
