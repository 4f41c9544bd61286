"""Wrapping a gRPC method handler's behaviour, whatever its streaming kind: the one dispatch and
the one interceptor shape the server interceptors (metrics, request guard) share."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

import grpc

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def split_method(full_method: str) -> tuple[str, str]:
    """``"/pkg.Service/Method"`` as (``"pkg.Service"``, ``"Method"``); "unknown" for a part
    that is missing."""
    service, _, name = full_method.lstrip("/").rpartition("/")
    return service or "unknown", name or "unknown"


def wrap_handler(
    handler: grpc.RpcMethodHandler, unary_response: Wrap, stream_response: Wrap
) -> grpc.RpcMethodHandler:
    """``handler`` with its behaviour wrapped: ``unary_response`` for methods that answer with
    one message, ``stream_response`` for those that answer with a stream."""
    if handler.unary_unary:
        return handler._replace(unary_unary=unary_response(handler.unary_unary))
    if handler.stream_unary:
        return handler._replace(stream_unary=unary_response(handler.stream_unary))
    if handler.unary_stream:
        return handler._replace(unary_stream=stream_response(handler.unary_stream))
    if handler.stream_stream:
        return handler._replace(stream_stream=stream_response(handler.stream_stream))
    return handler


class HandlerInterceptor(grpc.ServerInterceptor):
    """A server interceptor that replaces each method's handler with ``wrap``'s, the method named
    as (``"pkg.Service"``, ``"Method"``); unknown methods pass through untouched."""

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self.wrap(handler, *split_method(handler_call_details.method))

    @abstractmethod
    def wrap(
        self, handler: grpc.RpcMethodHandler, service: str, method: str
    ) -> grpc.RpcMethodHandler: ...
