"""Chunked tensor streams: exact round trips, and every broken stream named by its fault."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.v1 import common_pb2
from services.common.tensor_stream import StreamError, TensorStreamReceiver, encode, specs_of


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


@pytest.mark.reliability("R9")
def test_a_corrupted_chunk_fails_the_checksum():
    parts = list(encode(params(), 16))
    parts[2] = common_pb2.TensorChunk(offset_bytes=16, data=bytes(16))  # 2nd chunk zeroed
    with pytest.raises(StreamError, match="SHA-256"):
        receive(parts)


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
