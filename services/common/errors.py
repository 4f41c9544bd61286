"""The one place domain errors become gRPC status codes.

Servicers raise plain Python exceptions; ``translate_errors`` wraps each handler and aborts with
the mapped code and the exception's message. Anything unexpected becomes INTERNAL with a generic
message (the detail goes to the log, never to the peer).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from powertrip.fedavg import UpdateRejected

logger = logging.getLogger(__name__)


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


ERROR_CODES: dict[type[BaseException], grpc.StatusCode] = {
    BadRequest: grpc.StatusCode.INVALID_ARGUMENT,
    UpdateRejected: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    StaleRound: grpc.StatusCode.FAILED_PRECONDITION,
    Busy: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Duplicate: grpc.StatusCode.ALREADY_EXISTS,
    Forbidden: grpc.StatusCode.PERMISSION_DENIED,
}

F = TypeVar("F", bound=Callable[..., Any])


def status_for(exc: BaseException) -> grpc.StatusCode | None:
    for cls, code in ERROR_CODES.items():
        if isinstance(exc, cls):
            return code
    return None


def translate_errors(handler: F) -> F:
    """Decorate a servicer method ``(self, request, context)``."""

    @functools.wraps(handler)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return handler(self, request, context)
        except Exception as exc:
            if context.code() not in (None, grpc.StatusCode.OK):
                raise  # the handler aborted on purpose
            code = status_for(exc)
            name = f"{type(self).__name__}.{handler.__name__}"
            if code is None:
                logger.exception("[%s] unexpected error", name)
                context.abort(grpc.StatusCode.INTERNAL, "internal error")
            logger.warning("[%s] %s: %s", name, code.name, exc)
            context.abort(code, str(exc))

    return wrapper  # type: ignore[return-value]
