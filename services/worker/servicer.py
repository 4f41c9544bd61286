"""WorkerService: accept a round (its RoundSpec + streamed model), answer link probes.

Training never runs in a handler thread: ``StartRound`` validates and queues the round for the
worker's ``RoundRunner`` and returns at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc

from powertrip.services.common.errors import BadRequest, Busy, NotFound, translate_errors
from powertrip.services.common.identity import AGGREGATOR, PROFILER, require_role
from powertrip.services.common.tensor_receiver import TensorStreamReceiver
from powertrip.services.common.tensor_stream import StreamError
from powertrip.services.worker import metrics
from powertrip.services.worker.runner import RoundJob, RoundRunner
from powertrip.sites.profiles import site_id, site_index
from powertrip.v1 import worker_pb2, worker_pb2_grpc

logger = logging.getLogger(__name__)
MAX_PROBE_BYTES = 64 << 20
SERVICE = "WorkerService"


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    """Over TLS only the aggregator may start rounds; the aggregator and the profiler may probe
    (Ping, ProbeBandwidth). Another worker's certificate is refused before anything is read."""

    def __init__(self, runner: RoundRunner, hosted: list[int]) -> None:
        self.runner = runner
        self.hosted = set(hosted)

    @translate_errors
    def StartRound(  # noqa: N802 - gRPC method name
        self,
        request_iterator: Iterator[worker_pb2.StartRoundRequest],
        context: grpc.ServicerContext,
    ) -> worker_pb2.StartRoundResponse:
        require_role(context, SERVICE, "StartRound", (AGGREGATOR,))
        if not self.runner.ready:  # refuse before reading a possibly large model
            raise Busy("the worker is still loading its sites; retry shortly")
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("part") != "spec":
            raise BadRequest("a StartRound stream must open with the round spec")
        spec = first.spec
        try:
            sites = [site_index(s) for s in spec.site_ids]
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if not sites:
            raise BadRequest("the round spec names no site")
        unknown = [site_id(s) for s in sites if s not in self.hosted]
        if unknown:
            raise NotFound(f"sites {unknown} are not hosted by this worker")
        try:
            stream_rows = self.runner.round_inputs(spec)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        with TensorStreamReceiver() as rx:
            try:
                rx.consume(request_iterator)
            except StreamError as exc:
                raise BadRequest(f"global model rejected: {exc}") from None
            params = rx.arrays()
            metrics.MODEL_BYTES.inc(rx.total_bytes)
        power = {site_index(k): v for k, v in spec.power_fraction.items()}
        self.runner.submit(
            RoundJob(
                round=spec.round,
                sites=sites,
                params=params,
                deadline_s=spec.deadline_seconds,
                pace_by_power=spec.pace_by_power,
                power=power,
                stream_rows=stream_rows,
            )
        )
        logger.info(
            "[WorkerService.StartRound] round=%d sites=%s queued", spec.round, spec.site_ids
        )
        return worker_pb2.StartRoundResponse(round=spec.round, accepted_site_ids=spec.site_ids)

    @translate_errors
    def Ping(  # noqa: N802
        self, request: worker_pb2.PingRequest, context: grpc.ServicerContext
    ) -> worker_pb2.PingResponse:
        require_role(context, SERVICE, "Ping", (AGGREGATOR, PROFILER))
        return worker_pb2.PingResponse(payload=request.payload)

    def ProbeBandwidth(  # noqa: N802
        self, request: worker_pb2.ProbeBandwidthRequest, context: grpc.ServicerContext
    ) -> Iterator[worker_pb2.ProbeBandwidthResponse]:
        require_role(context, SERVICE, "ProbeBandwidth", (AGGREGATOR, PROFILER))
        total = request.total_bytes
        chunk = request.chunk_bytes or (1 << 20)
        if not 0 < total <= MAX_PROBE_BYTES or chunk > (2 << 20):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"probe of {total} bytes in {chunk}-byte chunks is outside the allowed bounds",
            )
        block = bytes(chunk)  # zeros: incompressible enough for gRPC, which does not compress
        sent = 0
        while sent < total:
            n = min(chunk, total - sent)
            yield worker_pb2.ProbeBandwidthResponse(data=block[:n])
            sent += n
