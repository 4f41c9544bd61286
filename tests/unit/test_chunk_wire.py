"""The hand-written chunk encoding and its no-copy decoder mean exactly what protobuf means."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from powertrip.services.common.chunk_wire import (
    CHUNK_TAG,
    ChunkView,
    chunk_request,
    read_submit_request,
    varint,
)
from powertrip.v1 import aggregator_pb2, common_pb2

Request = aggregator_pb2.SubmitUpdateRequest


def chunk(offset: int, data: bytes) -> Request:
    return Request(chunk=common_pb2.TensorChunk(offset_bytes=offset, data=data))


@pytest.mark.parametrize("offset", [0, 1, 127, 128, 1 << 20, (1 << 40) + 3])
@pytest.mark.parametrize("size", [1, 4, 127, 128, 300, 512 << 10])
def test_a_chunk_request_is_protobufs_bytes_and_decodes_to_a_view_of_them(offset, size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    wire = chunk_request(offset, [memoryview(data[: size // 2]), memoryview(data[size // 2 :])])
    assert wire == chunk(offset, data).SerializeToString()
    got = read_submit_request(wire)
    assert isinstance(got, ChunkView)
    assert got.WhichOneof("part") == "chunk"
    assert got.chunk.offset_bytes == offset
    assert bytes(got.chunk.data) == data
    assert got.chunk.data.obj is wire  # a view of the received bytes, not a copy


def test_the_other_parts_of_a_stream_go_through_protobuf():
    for msg in (
        Request(update=aggregator_pb2.UpdateHeader(worker_id="w", site_id="site-1", round=3)),
        Request(header=common_pb2.TensorStreamHeader(total_bytes=8)),
        Request(trailer=common_pb2.TensorStreamTrailer(xxh3_128="ab")),
    ):
        got = read_submit_request(msg.SerializeToString())
        assert isinstance(got, Request)
        assert got == msg


def inner(*fields: bytes) -> bytes:
    body = b"".join(fields)
    return CHUNK_TAG + varint(len(body)) + body


OFFSET_7 = b"\x08" + varint(7)
DATA_AB = b"\x12" + varint(2) + b"ab"


@pytest.mark.parametrize(
    "wire",
    [
        inner(DATA_AB, OFFSET_7),  # fields in the other order
        inner(b"\x08\x00", DATA_AB),  # a zero offset written out
        inner(b"\x08\x87\x80\x00", DATA_AB),  # an over-long varint for 7
        inner(OFFSET_7, DATA_AB, b"\x18\x01"),  # an unknown field after the data
        inner(OFFSET_7, b"\x12\x01a", b"\x12\x02ab"),  # data repeated: the last one counts
    ],
    ids=["reordered", "zero-offset", "long-varint", "unknown-field", "repeated-data"],
)
def test_a_valid_but_unusual_encoding_means_what_protobuf_says(wire):
    want = Request.FromString(wire)
    got = read_submit_request(wire)
    assert got.WhichOneof("part") == "chunk"
    assert (got.chunk.offset_bytes, bytes(got.chunk.data)) == (
        want.chunk.offset_bytes,
        want.chunk.data,
    )


@pytest.mark.parametrize(
    "wire",
    [
        CHUNK_TAG + varint(100) + OFFSET_7 + DATA_AB,  # outer length beyond the message
        CHUNK_TAG + varint(5) + OFFSET_7 + b"\x12" + varint(50) + b"ab",  # data length lies
        CHUNK_TAG + b"\xff" * 11,  # a varint that never ends
        inner(OFFSET_7, b"\x12" + varint(9) + b"ab"),  # data shorter than announced
    ],
    ids=["outer-overrun", "data-overrun", "endless-varint", "short-data"],
)
def test_a_malformed_chunk_fails_as_protobufs_parse_does(wire):
    with pytest.raises(DecodeError):
        Request.FromString(wire)
    with pytest.raises(DecodeError):
        read_submit_request(wire)
