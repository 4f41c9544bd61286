"""How AggregatorService goes onto a gRPC server: the generated method handlers, except that
the update uploads' requests are read by ``chunk_wire.read_submit_request``, so a chunk's data
reaches the receiver as a view of the bytes gRPC received instead of two protobuf copies."""

from __future__ import annotations

from typing import Any

import grpc

from powertrip.services.common.chunk_wire import read_submit_request
from powertrip.v1 import aggregator_pb2_grpc

UPLOADS = ("SubmitUpdate", "UploadUpdate")


def add_to_server(servicer: aggregator_pb2_grpc.AggregatorServiceServicer, server: Any) -> None:
    """``add_AggregatorServiceServicer_to_server`` with the uploads' deserializer replaced."""
    captured: dict[str, Any] = {}

    class _Capture:  # collects the generated method handlers instead of registering them
        def add_generic_rpc_handlers(self, handlers: Any) -> None:
            pass

        def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
            captured[service] = dict(handlers)

    aggregator_pb2_grpc.add_AggregatorServiceServicer_to_server(servicer, _Capture())
    ((service, handlers),) = captured.items()
    for name in UPLOADS:
        handlers[name] = handlers[name]._replace(request_deserializer=read_submit_request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)
