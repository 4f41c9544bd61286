"""Streams one site's update to the aggregator: update header, tensor stream, checksum.

``update_messages`` yields the stream as protobuf messages (what tests and tools tamper with).
``GrpcUploader`` sends the same stream pre-serialized (``update_wire``): each chunk's
``SubmitUpdateRequest`` bytes are built by hand (``chunk_wire.chunk_request``), the tensor bytes
copied once, straight from the delta into the message, where going through protobuf copies them
three times (the chunk message, the request wrapping it, the serialization) and each copy costs
about as much as the network on loopback. The bytes equal what protobuf would produce
(tests/unit/test_tensor_stream.py).

Two options halve or split an upload. ``bf16``: float32 tensors travel as bfloat16 (half the
bytes, rounded to nearest even; the aggregator widens them exactly). Shards: a site trained by N
ranks sends N concurrent streams (``GrpcUploader.send_shards``), stream i holding rows
``shard_rows(dim0, N, i)`` of every tensor (``shard_updates`` cuts a whole update so); the
aggregator counts the site once every shard arrived and verified. An update the host coded
with the run's codec (``SiteUpdate.codec``: ``state_dir.WorkerBook.leaving``) travels as its
payload's parts, whole or shard by shard, naming the codec in each header (never as bf16).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

import grpc
from numpy.typing import NDArray

from powertrip.services.common.chunk_wire import chunk_request
from powertrip.services.common.fault_points import fault_point
from powertrip.services.common.tensor_stream import (
    chunk_views,
    encode,
    new_digest,
    shard_of,
    stream_header,
    wrap_tensor_stream,
)
from powertrip.services.worker.upload_credit import upload
from powertrip.sites.profiles import site_id
from powertrip.v1 import aggregator_pb2, common_pb2

if TYPE_CHECKING:  # a type only: importing sites_host loads torch
    from powertrip.services.worker.sites_host import SiteUpdate

_SERVICE = aggregator_pb2.DESCRIPTOR.services_by_name["AggregatorService"]
UPLOAD_UPDATE = f"/{_SERVICE.full_name}/UploadUpdate"
#: (shard index, shard count) of a sharded stream; None: the whole update
Shard = tuple[int, int] | None


def _update_header(
    worker_id: str, round_index: int, update: SiteUpdate, shard: Shard = None, codec: str = ""
) -> aggregator_pb2.UpdateHeader:
    index, count = shard or (0, 0)  # zeros are not serialized: a whole update's bytes as before
    codec = "" if codec == "none" else codec  # likewise: codec none's header is as before
    return aggregator_pb2.UpdateHeader(
        worker_id=worker_id,
        site_id=site_id(update.site),
        round=round_index,
        num_samples=update.num_samples,
        train_seconds=update.train_seconds,
        shard_index=index,
        shard_count=count,
        codec=codec,
        train_loss=update.loss,  # None leaves it absent: not measured
    )


def update_messages(
    worker_id: str,
    round_index: int,
    update: SiteUpdate,
    chunk_bytes: int,
    bf16: bool = False,
    shard: Shard = None,
    codec: str = "",
) -> Iterator[aggregator_pb2.SubmitUpdateRequest]:
    """The reference stream through protobuf (tests compare ``update_wire`` with it, and tamper
    with its messages); the worker sends ``update_wire``. ``shard``: ``update.delta`` is shard
    (index, count) of the site's update (``shard_updates``); ``codec``: the codec whose payload
    parts ``update.delta`` holds (``ErrorFeedback.encode``)."""
    head = _update_header(worker_id, round_index, update, shard, codec)
    yield aggregator_pb2.SubmitUpdateRequest(update=head)
    yield from wrap_tensor_stream(
        encode(update.delta, chunk_bytes, bf16), aggregator_pb2.SubmitUpdateRequest
    )


def tensor_wire(
    params: Mapping[str, NDArray], chunk_bytes: int, bf16: bool = False
) -> Iterator[bytes]:
    """The serialized ``SubmitUpdateRequest`` parts of a tensor stream: header, chunks, trailer
    (the messages ``encode`` + ``wrap_tensor_stream`` make, already as bytes)."""
    request = aggregator_pb2.SubmitUpdateRequest
    yield request(header=stream_header(params, bf16)).SerializeToString()
    digest = new_digest()
    for offset, views in chunk_views(params, chunk_bytes, bf16):
        for v in views:
            digest.update(v)
        yield chunk_request(offset, views)
    trailer = common_pb2.TensorStreamTrailer(xxh3_128=digest.hexdigest())
    yield request(trailer=trailer).SerializeToString()


def update_wire(
    worker_id: str,
    round_index: int,
    update: SiteUpdate,
    chunk_bytes: int,
    bf16: bool = False,
    shard: Shard = None,
    codec: str = "",
) -> Iterator[bytes]:
    """``update_messages``, serialized: what ``GrpcUploader`` sends."""
    head = _update_header(worker_id, round_index, update, shard, codec)
    yield aggregator_pb2.SubmitUpdateRequest(update=head).SerializeToString()
    for i, message in enumerate(tensor_wire(update.delta, chunk_bytes, bf16)):
        yield message
        if i == 1:  # the stream's header and first chunk are out
            fault_point("upload", round_index, settle_s=0.3)


def shard_updates(update: SiteUpdate, count: int) -> list[SiteUpdate]:
    """``update`` cut into ``count`` shards as FSDP2's ranks hold it (``shard_of``: views, no
    copy), each with the site's weight and train time: what ``send_shards`` takes."""
    return [replace(update, delta=shard_of(update.delta, count, i)) for i in range(count)]


class GrpcUploader:
    """Sends a site's update: whole (``__call__``) or as per-rank shards (``send_shards``);
    ``bf16``: float32 tensors travel as bfloat16."""

    def __init__(
        self, channel: grpc.Channel, worker_id: str, chunk_bytes: int, bf16: bool = False
    ) -> None:
        # Requests go out as the bytes update_wire builds: no request serializer. UploadUpdate:
        # SubmitUpdate's stream, sent within the aggregator's credit (upload_credit).
        self._upload = channel.stream_stream(
            UPLOAD_UPDATE,
            request_serializer=None,
            response_deserializer=aggregator_pb2.UploadReply.FromString,
        )
        self.worker_id = worker_id
        self.chunk_bytes = chunk_bytes
        self.bf16 = bf16

    def __call__(
        self, round_index: int, update: SiteUpdate, timeout_s: float, shard: Shard = None
    ) -> None:
        """Send ``update``: whole, as shard ``shard`` (index, count) of its site's update, or,
        when it carries per-rank ``shards`` (a site trained over N ranks), as N streams."""
        # Not retried: a resend after a partial failure is the aggregator's call (stale round).
        shards = getattr(update, "shards", None)
        if shard is None and shards:
            parts = [replace(update, delta=d, shards=None) for d in shards]
            self.send_shards(round_index, parts, timeout_s)
            return
        codec = update.codec  # coded by the host: the payload's parts travel, not floats
        args = (self.chunk_bytes, self.bf16 and not codec, shard, codec)
        upload(self._upload, update_wire(self.worker_id, round_index, update, *args), timeout_s)

    def send_shards(self, round_index: int, shards: Sequence[SiteUpdate], timeout_s: float) -> None:
        """One site's update as ``len(shards)`` concurrent streams: ``shards[i].delta`` holds rows
        ``shard_rows(dim0, len(shards), i)`` of every tensor (0-d tensors in shard 0 only), e.g.
        rank i's FSDP2 shard or ``shard_updates(update, n)[i]``; every shard names the same site
        and weight. Waits for all; raises the first failure (the site then counts for nothing
        this round unless every shard is sent again)."""
        if not shards or len({(u.site, u.num_samples) for u in shards}) != 1:
            raise ValueError("the shards must be one site's, with one weight")
        n = len(shards)
        with ThreadPoolExecutor(n, thread_name_prefix="upload-shard") as pool:
            calls = [
                pool.submit(self, round_index, u, timeout_s, (i, n)) for i, u in enumerate(shards)
            ]
            errors = [c.exception() for c in calls]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
