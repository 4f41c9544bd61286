"""Streams one site's update to the aggregator: update header, tensor stream, checksum."""

from __future__ import annotations

from collections.abc import Iterator

from powertrip.sites import site_id
from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc
from services.common.fault_points import fault_point
from services.common.tensor_stream import encode, wrap_tensor_stream
from services.worker.sites_host import SiteUpdate


def update_messages(
    worker_id: str, round_index: int, update: SiteUpdate, chunk_bytes: int
) -> Iterator[aggregator_pb2.SubmitUpdateRequest]:
    yield aggregator_pb2.SubmitUpdateRequest(
        update=aggregator_pb2.UpdateHeader(
            worker_id=worker_id,
            site_id=site_id(update.site),
            round=round_index,
            num_samples=update.num_samples,
            train_seconds=update.train_seconds,
        )
    )
    for i, message in enumerate(
        wrap_tensor_stream(encode(update.delta, chunk_bytes), aggregator_pb2.SubmitUpdateRequest)
    ):
        yield message
        if i == 1:  # the stream's header and first chunk are out
            fault_point("upload", round_index, settle_s=0.3)


class GrpcUploader:
    def __init__(
        self, stub: aggregator_pb2_grpc.AggregatorServiceStub, worker_id: str, chunk_bytes: int
    ) -> None:
        self.stub = stub
        self.worker_id = worker_id
        self.chunk_bytes = chunk_bytes

    def __call__(self, round_index: int, update: SiteUpdate, timeout_s: float) -> None:
        # Not retried: a resend after a partial failure is the aggregator's call (stale round).
        self.stub.SubmitUpdate(
            update_messages(self.worker_id, round_index, update, self.chunk_bytes),
            timeout=timeout_s,
        )
