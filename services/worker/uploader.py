"""Streams one site's update to the aggregator: update header, tensor stream, checksum.

``update_messages`` yields the stream as protobuf messages (what tests and tools tamper with).
``GrpcUploader`` sends the same stream pre-serialized (``update_wire``): each chunk's
``SubmitUpdateRequest`` bytes are built by hand, the tensor bytes copied once, straight from the
delta into the message, where going through protobuf copies them three times (the chunk
message, the request wrapping it, the serialization) and each copy costs about as much as the
network on loopback. The bytes equal what protobuf would produce (tests/unit/test_tensor_stream.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import grpc
from numpy.typing import NDArray

from powertrip.sites import site_id
from powertrip.v1 import aggregator_pb2, common_pb2
from services.common.fault_points import fault_point
from services.common.tensor_stream import (
    chunk_views,
    encode,
    new_digest,
    stream_header,
    wrap_tensor_stream,
)

if TYPE_CHECKING:  # a type only: importing sites_host loads torch
    from services.worker.sites_host import SiteUpdate

_SERVICE = aggregator_pb2.DESCRIPTOR.services_by_name["AggregatorService"]
SUBMIT_UPDATE = f"/{_SERVICE.full_name}/SubmitUpdate"
_LEN = 2  # protobuf wire type of a length-delimited field


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(message: type, field: str, wire_type: int) -> bytes:
    return _varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | wire_type)


_CHUNK_TAG = _tag(aggregator_pb2.SubmitUpdateRequest, "chunk", _LEN)
_OFFSET_TAG = _tag(common_pb2.TensorChunk, "offset_bytes", 0)
_DATA_TAG = _tag(common_pb2.TensorChunk, "data", _LEN)


def chunk_request(offset: int, views: list[memoryview]) -> bytes:
    """``SubmitUpdateRequest(chunk=TensorChunk(offset_bytes=offset, data=<views joined>))``,
    serialized, with the data copied once. Field order and the omitted zero offset follow
    protobuf's own serializer, so the bytes are the same."""
    size = sum(len(v) for v in views)
    inner = (_OFFSET_TAG + _varint(offset) if offset else b"") + _DATA_TAG + _varint(size)
    return b"".join([_CHUNK_TAG, _varint(len(inner) + size), inner, *views])


def _update_header(
    worker_id: str, round_index: int, update: SiteUpdate
) -> aggregator_pb2.UpdateHeader:
    return aggregator_pb2.UpdateHeader(
        worker_id=worker_id,
        site_id=site_id(update.site),
        round=round_index,
        num_samples=update.num_samples,
        train_seconds=update.train_seconds,
    )


def update_messages(
    worker_id: str, round_index: int, update: SiteUpdate, chunk_bytes: int
) -> Iterator[aggregator_pb2.SubmitUpdateRequest]:
    """The reference stream through protobuf (tests compare ``update_wire`` with it, and tamper
    with its messages); the worker sends ``update_wire``."""
    yield aggregator_pb2.SubmitUpdateRequest(update=_update_header(worker_id, round_index, update))
    yield from wrap_tensor_stream(
        encode(update.delta, chunk_bytes), aggregator_pb2.SubmitUpdateRequest
    )


def tensor_wire(params: Mapping[str, NDArray], chunk_bytes: int) -> Iterator[bytes]:
    """The serialized ``SubmitUpdateRequest`` parts of a tensor stream: header, chunks, trailer
    (the messages ``encode`` + ``wrap_tensor_stream`` make, already as bytes)."""
    request = aggregator_pb2.SubmitUpdateRequest
    yield request(header=stream_header(params)).SerializeToString()
    digest = new_digest()
    for offset, views in chunk_views(params, chunk_bytes):
        for v in views:
            digest.update(v)
        yield chunk_request(offset, views)
    trailer = common_pb2.TensorStreamTrailer(xxh3_128=digest.hexdigest())
    yield request(trailer=trailer).SerializeToString()


def update_wire(
    worker_id: str, round_index: int, update: SiteUpdate, chunk_bytes: int
) -> Iterator[bytes]:
    """``update_messages``, serialized: what ``GrpcUploader`` sends."""
    head = aggregator_pb2.SubmitUpdateRequest(update=_update_header(worker_id, round_index, update))
    yield head.SerializeToString()
    for i, message in enumerate(tensor_wire(update.delta, chunk_bytes)):
        yield message
        if i == 1:  # the stream's header and first chunk are out
            fault_point("upload", round_index, settle_s=0.3)


class GrpcUploader:
    def __init__(self, channel: grpc.Channel, worker_id: str, chunk_bytes: int) -> None:
        # Requests go out as the bytes update_wire builds: no request serializer.
        self._submit = channel.stream_unary(
            SUBMIT_UPDATE,
            request_serializer=None,
            response_deserializer=aggregator_pb2.SubmitUpdateResponse.FromString,
        )
        self.worker_id = worker_id
        self.chunk_bytes = chunk_bytes

    def __call__(self, round_index: int, update: SiteUpdate, timeout_s: float) -> None:
        # Not retried: a resend after a partial failure is the aggregator's call (stale round).
        self._submit(
            update_wire(self.worker_id, round_index, update, self.chunk_bytes), timeout=timeout_s
        )
