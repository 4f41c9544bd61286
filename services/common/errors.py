"""The one place domain errors become gRPC status codes.

Servicers raise plain Python exceptions; ``translate_errors`` wraps each handler and aborts with
the mapped code and the exception's message. Anything unexpected becomes INTERNAL with a generic
message (the detail goes to the log, never to the peer).

Logs stay quiet under abuse: a client's error is one line (method, peer, code, short reason) and
only a server bug gets a traceback; both go through one per-process ``LogLimiter`` keyed by
(method, code). ``RequestGuard``, an interceptor every server built by ``build_server`` has,
extends this to what no handler sees: undecodable request bytes are answered INVALID_ARGUMENT
(gRPC would log a traceback per message and answer INTERNAL), and an exception escaping a handler
without ``translate_errors`` is mapped the same way.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import grpc

from powertrip.aggregation.fedavg import UpdateRejected
from powertrip.services.common.handlers import HandlerInterceptor, wrap_handler
from powertrip.services.common.log_limit import LogLimiter, one_line

logger = logging.getLogger(__name__)
#: at most 5 lines per (method, code) per minute and process; the rest become one summary line
LIMITER = LogLimiter(burst=5, interval_s=60.0, logger=logger)
#: status details echo the request (ids, site names): cut them, a peer's 8 KiB metadata limit
#: would otherwise turn the answer into RESOURCE_EXHAUSTED
MAX_DETAIL_CHARS = 1000


class NotFound(LookupError):
    """Unknown site, worker or round."""


class StaleRound(RuntimeError):
    """An update or request for a round that is not the open one (or not this site's)."""


class Duplicate(RuntimeError):
    """Something that exists already: a second update from one site in one round."""


class Busy(RuntimeError):
    """The peer is occupied (a worker already training)."""


class BadRequest(ValueError):
    """A malformed request: missing field, broken chunk sequence, checksum mismatch."""


class Forbidden(PermissionError):
    """An authenticated caller acting for someone else, or not admitted to the run."""


class MalformedRequest(BadRequest):
    """Request bytes that do not decode as the method's message."""


class StreamBroken(ConnectionError):
    """The caller's request stream broke off half-way (killed, link lost): the caller's loss,
    answered CANCELLED with one log line, never a server traceback."""


ERROR_CODES: dict[type[BaseException], grpc.StatusCode] = {
    BadRequest: grpc.StatusCode.INVALID_ARGUMENT,
    UpdateRejected: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    StaleRound: grpc.StatusCode.FAILED_PRECONDITION,
    Busy: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Duplicate: grpc.StatusCode.ALREADY_EXISTS,
    Forbidden: grpc.StatusCode.PERMISSION_DENIED,
    StreamBroken: grpc.StatusCode.CANCELLED,
}

S = TypeVar("S")  # the servicer
Q = TypeVar("Q")  # the request, or its stream
R = TypeVar("R")  # the reply, or its stream


def status_for(exc: BaseException) -> grpc.StatusCode | None:
    for cls, code in ERROR_CODES.items():
        if isinstance(exc, cls):
            return code
    return None


def peer_of(context: grpc.ServicerContext) -> str:
    try:
        return str(context.peer())
    except Exception:  # a test double without a peer
        return "unknown"


def reject(method: str, exc: BaseException, context: grpc.ServicerContext) -> NoReturn:
    """Abort the call for ``exc``: a client's error with its code and message, logged as one
    rate-limited line; anything else INTERNAL, with a rate-limited traceback (call it from the
    ``except`` block)."""
    code = status_for(exc)
    if code is None:
        if LIMITER.allow((method, "INTERNAL")):
            logger.exception("unexpected error method=%s peer=%s", method, peer_of(context))
        context.abort(grpc.StatusCode.INTERNAL, "internal error")
    else:
        if LIMITER.allow((method, code.name)):
            logger.warning(
                "rejected method=%s peer=%s code=%s reason=%s",
                method,
                peer_of(context),
                code.name,
                one_line(str(exc)),
            )
        context.abort(code, one_line(str(exc), MAX_DETAIL_CHARS))
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


def service_name(servicer: object) -> str:
    """``AggregatorService`` for a subclass of the generated ``AggregatorServiceServicer``."""
    for cls in type(servicer).__mro__:
        if cls.__module__.endswith("_pb2_grpc") and cls.__name__.endswith("Servicer"):
            return cls.__name__.removesuffix("Servicer")
    return type(servicer).__name__


def _aborted(context: grpc.ServicerContext) -> bool:
    return context.code() not in (None, grpc.StatusCode.OK)


def translate_errors(
    handler: Callable[[S, Q, grpc.ServicerContext], R],
) -> Callable[[S, Q, grpc.ServicerContext], R]:
    """Decorate a servicer method ``(self, request, context)``."""

    @functools.wraps(handler)
    def wrapper(self: S, request: Q, context: grpc.ServicerContext) -> R:
        try:
            return handler(self, request, context)
        except Exception as exc:
            if _aborted(context):
                raise  # the handler aborted on purpose
            reject(f"{service_name(self)}.{handler.__name__}", exc, context)

    return wrapper


class _Undecodable:
    """What the guarded deserializer hands on instead of letting gRPC log and answer INTERNAL."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _lenient(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:
            return _Undecodable(f"undecodable request ({len(data)} bytes): {exc}")

    return parse


def _checked(requests: Iterator[Any]) -> Iterator[Any]:
    try:
        for request in requests:
            if isinstance(request, _Undecodable):
                raise MalformedRequest(request.reason)
            yield request
    except grpc.RpcError:  # gRPC's request iterator: the peer went away mid-stream
        raise StreamBroken("the request stream broke off") from None


class RequestGuard(HandlerInterceptor):
    """Undecodable requests become INVALID_ARGUMENT before (unary) or as (streams) the handler
    reads them; exceptions that escape a handler are mapped and logged like ``translate_errors``
    does, so no RPC ends in gRPC's own unlimited traceback logging."""

    def wrap(
        self, handler: grpc.RpcMethodHandler, service: str, method: str
    ) -> grpc.RpcMethodHandler:
        rpc = f"{service.rpartition('.')[2]}.{method}"  # as translate_errors names it

        def guard(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                reject(rpc, MalformedRequest(request.reason), context)
            if handler.request_streaming:
                return _checked(request)
            return request

        def unary_response(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
                request = guard(request, context)
                try:
                    return behavior(request, context)
                except Exception as exc:
                    if _aborted(context):
                        raise
                    reject(rpc, exc, context)

            return wrapped

        def stream_response(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                request = guard(request, context)
                try:
                    yield from behavior(request, context)
                except Exception as exc:
                    if _aborted(context):
                        raise
                    reject(rpc, exc, context)

            return wrapped

        if handler.request_deserializer is not None:
            handler = handler._replace(request_deserializer=_lenient(handler.request_deserializer))
        return wrap_handler(handler, unary_response, stream_response)
