"""A tensor chunk's ``SubmitUpdateRequest`` on the wire, encoded and decoded by hand.

Almost every byte of an upload sits in ``SubmitUpdateRequest(chunk=TensorChunk(offset, data))``
messages. Through protobuf each one costs the receiver two copies of its data (the parse into the
message's arena, then a fresh ``bytes`` when ``.data`` is read), together about as much CPU as
the network on loopback (benchmarks/README.md, upload). ``chunk_request`` builds the message's
bytes with the data copied once; ``read_submit_request`` (the aggregator's request
deserializer) hands the data on as a ``memoryview`` of the bytes gRPC received: no copy.

Anything that is not exactly the canonical chunk encoding (what ``chunk_request`` and protobuf's
own serializer write: the offset, omitted when zero, then the data, nothing else) goes to
protobuf's parser, so a peer's odd but valid encoding means the same thing either way, and a
malformed one fails the same way (``DecodeError``, which the stream reports as bad input).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from powertrip.v1 import aggregator_pb2, common_pb2

_LEN, _VARINT = 2, 0  # protobuf wire types
_MAX_VARINT_BYTES = 10  # a uint64


def varint(n: int) -> bytes:
    """``n`` (>= 0) as a protobuf varint."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(message: type[Message], field: str, wire_type: int) -> bytes:
    return varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | wire_type)


CHUNK_TAG = _tag(aggregator_pb2.SubmitUpdateRequest, "chunk", _LEN)
OFFSET_TAG = _tag(common_pb2.TensorChunk, "offset_bytes", _VARINT)
DATA_TAG = _tag(common_pb2.TensorChunk, "data", _LEN)


def chunk_request(offset: int, views: list[memoryview]) -> bytes:
    """``SubmitUpdateRequest(chunk=TensorChunk(offset_bytes=offset, data=<views joined>))``,
    serialized, with the data copied once. Field order and the omitted zero offset follow
    protobuf's own serializer, so the bytes are the same."""
    size = sum(len(v) for v in views)
    inner = (OFFSET_TAG + varint(offset) if offset else b"") + DATA_TAG + varint(size)
    return b"".join([CHUNK_TAG, varint(len(inner) + size), inner, *views])


@dataclass(frozen=True)
class ChunkView:
    """A received chunk request: what a ``SubmitUpdateRequest`` with its ``chunk`` part set
    answers (``WhichOneof("part")``, ``.chunk.offset_bytes``, ``.chunk.data``), the data a
    view of the received bytes."""

    offset_bytes: int
    data: memoryview

    def WhichOneof(self, group: str) -> str:  # noqa: N802 - protobuf's name
        return "chunk"

    @property
    def chunk(self) -> ChunkView:
        return self


def _read_varint(buf: bytes, pos: int) -> tuple[int, int] | None:
    """(value, position after it), or None if the bytes there are not a complete varint."""
    value = shift = 0
    for i in range(pos, min(pos + _MAX_VARINT_BYTES, len(buf))):
        b = buf[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + 1
        shift += 7
    return None


def _canonical_chunk(data: bytes) -> ChunkView | None:
    """The chunk in ``data`` if it is encoded exactly as ``chunk_request`` writes it."""
    if not data.startswith(CHUNK_TAG):
        return None
    outer = _read_varint(data, len(CHUNK_TAG))
    if outer is None or outer[1] + outer[0] != len(data):
        return None
    pos, offset = outer[1], 0
    if data.startswith(OFFSET_TAG, pos):
        read = _read_varint(data, pos + len(OFFSET_TAG))
        if read is None or read[0] == 0:  # protobuf omits a zero offset
            return None
        offset, pos = read
    if not data.startswith(DATA_TAG, pos):
        return None
    size = _read_varint(data, pos + len(DATA_TAG))
    if size is None or size[1] + size[0] != len(data):  # the data runs to the end, exactly
        return None
    return ChunkView(offset, memoryview(data)[size[1] :])


def read_submit_request(data: bytes) -> aggregator_pb2.SubmitUpdateRequest | ChunkView:
    """The aggregator's ``SubmitUpdate`` request deserializer: a chunk as a ``ChunkView`` (no
    copy of its data), anything else through protobuf."""
    chunk = _canonical_chunk(data)
    if chunk is not None:
        return chunk
    return aggregator_pb2.SubmitUpdateRequest.FromString(data)
