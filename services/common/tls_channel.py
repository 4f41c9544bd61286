"""A client TLS channel that checks the server's identity name, follows its certificate files,
and says why a handshake is refused.

* Identity: the server must present a certificate for ``identity`` (``aggregator``, ``profiler``
  or a worker id), whatever address is dialled (``grpc.ssl_target_name_override``). Certificates
  carry only their own name, so one worker's key cannot pose as the aggregator or another worker.
* Renewal: at call time, at most once per ``RELOAD_CHECK_S``, one ``stat`` per file; when the
  certificate, key or CA changed, new calls go to a fresh underlying channel (new connection, new
  certificate); calls in flight finish on the old one. Stubs keep the multicallables they made at
  construction, so those resolve the current channel per call.
* Refusals: a TLS call failing UNAVAILABLE is diagnosed once (``cert_check``); a certificate
  problem is logged in one line and raised as ``TlsRefused``, which retries do not repeat.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from powertrip.services.common.cert_check import local_problem, pair_mismatch, probe
from powertrip.services.common.log_limit import LogLimiter, one_line

logger = logging.getLogger(__name__)
RELOAD_CHECK_S = 1.0
DIAGNOSIS_TTL_S = 5.0  # a verdict is reused this long: a retry loop does not probe per attempt
_limiter = LogLimiter(burst=1, interval_s=60.0, logger=logger)


class TlsRefused(grpc.RpcError):
    """UNAVAILABLE because of a certificate: permanent until someone fixes the files or clock."""

    def __init__(self, message: str, cause: grpc.RpcError) -> None:
        super().__init__(message)
        self.message = message
        self.cause = cause

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self.message

    def __str__(self) -> str:
        return self.message


def _signature(paths: Sequence[str]) -> tuple[tuple[int, int], ...]:
    return tuple((st.st_mtime_ns, st.st_size) for st in (os.stat(p) for p in paths))


class IdentityChannel(grpc.Channel):
    """``grpc.secure_channel`` to ``address`` expecting ``identity``, reloading its files."""

    def __init__(
        self,
        address: str,
        identity: str,
        cert_path: str,
        key_path: str,
        ca_path: str,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.address, self.identity = address, identity
        self.paths = (cert_path, key_path, ca_path)
        self._options = [*options, ("grpc.ssl_target_name_override", identity)]
        self._lock = threading.Lock()
        self._sig = _signature(self.paths)
        self._checked = time.monotonic()
        self._channel = self._build(*(open(p, "rb").read() for p in self.paths))  # noqa: SIM115
        self._verdict: tuple[float, str | None] = (-DIAGNOSIS_TTL_S, None)
        self._closed = False

    def _build(self, cert: bytes, key: bytes, ca: bytes) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(ca, key, cert)
        return grpc.secure_channel(self.address, creds, options=self._options)

    def current(self) -> grpc.Channel:
        """The underlying channel, rebuilt first if the certificate files changed."""
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_S:
            return self._channel
        with self._lock:
            if now - self._checked >= RELOAD_CHECK_S:
                self._checked = now
                self._reload_if_changed()
            return self._channel

    def _reload_if_changed(self) -> None:
        if self._closed:
            return
        try:
            sig = _signature(self.paths)
        except OSError:  # a file replaced mid-rotation: keep the current one, look again soon
            return
        if sig == self._sig:
            return
        try:
            cert, key, ca = (Path(p).read_bytes() for p in self.paths)
            if pair_mismatch(cert, key):
                return  # the certificate is new and the key not yet (or vice versa): wait
            fresh = self._build(cert, key, ca)
        except Exception as exc:  # unreadable: keep the working channel
            logger.error("TLS files %s unreadable, keeping the current ones: %s", self.paths, exc)
            return
        self._sig = sig
        self._channel = fresh  # the old one is freed once its calls in flight finish
        self._verdict = (-DIAGNOSIS_TTL_S, None)
        logger.info("TLS certificate files changed; new calls to %s use them", self.identity)

    def bind(self, channel: grpc.Channel, kind: str, method: str, args: tuple, kwargs: dict) -> Any:
        """``channel``'s multicallable for ``method``; ValueError once closed, as grpcio says it,
        because grpcio crashes the process (SIGSEGV) making a registered method on a closed
        channel, which a stub's first call after ``close`` would otherwise do here."""
        with self._lock:
            if self._closed:
                raise ValueError("Cannot invoke RPC on closed channel!")
            return getattr(channel, kind)(method, *args, **kwargs)

    def refused(self, exc: grpc.RpcError) -> TlsRefused | None:
        """``exc`` explained as a certificate problem, or None if it is not one."""
        if exc.code() is not grpc.StatusCode.UNAVAILABLE:
            return None
        now = time.monotonic()
        at, reason = self._verdict
        if now - at >= DIAGNOSIS_TTL_S:
            reason = local_problem(*self.paths)
            if reason is None and _handshake_suspect(exc):
                reason = probe(self.address, self.identity, *self.paths)
            self._verdict = (now, reason)
        if reason is None:
            return None
        message = one_line(f"TLS to {self.identity} at {self.address} refused: {reason}", 400)
        kind = re.sub(r"\d", "", reason)  # the same reason at another "now" is no news
        if _limiter.allow((self.identity, self.address, kind)):
            logger.error("%s", message)
        return TlsRefused(message, exc)

    # -- grpc.Channel --------------------------------------------------------------------------
    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Multicallable(self, "unary_unary", method, args, kwargs)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Multicallable(self, "stream_unary", method, args, kwargs)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Multicallable(self, "unary_stream", method, args, kwargs)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Multicallable(self, "stream_stream", method, args, kwargs)

    def subscribe(self, callback: Callable[..., None], try_to_connect: bool = False) -> None:
        self.current().subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Callable[..., None]) -> None:
        self._channel.unsubscribe(callback)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._channel.close()

    def __enter__(self) -> IdentityChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _handshake_suspect(exc: grpc.RpcError) -> bool:
    """Worth a probe: not a plain "nobody listens there" (the server is down, not refusing),
    nor an attempt that timed out (a busy server: a probe would only add to its queue)."""
    details = (exc.details() or "").lower()
    quiet = ("connection refused", "deadline", "dns resolution", "timed out", "timeout")
    return not any(s in details for s in quiet)


class _Multicallable:
    """A stub's method: resolves the channel's current connection at every call."""

    def __init__(
        self, owner: IdentityChannel, kind: str, method: str, args: tuple, kwargs: dict
    ) -> None:
        self._owner, self._kind, self._method = owner, kind, method
        self._args, self._kwargs = args, kwargs
        self._made: tuple[grpc.Channel, Any] | None = None

    def _resolve(self) -> Any:
        channel = self._owner.current()
        made = self._made
        if made is None or made[0] is not channel:
            bound = self._owner.bind(channel, self._kind, self._method, self._args, self._kwargs)
            made = self._made = (channel, bound)
        return made[1]

    def _explained(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except grpc.RpcError as exc:
            refused = self._owner.refused(exc)
            if refused is None:
                raise
            raise refused from exc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        target = self._resolve()
        if self._kind.endswith("_stream"):  # errors come while iterating: passed through as-is
            return target(*args, **kwargs)
        return self._explained(lambda: target(*args, **kwargs))

    def with_call(self, *args: Any, **kwargs: Any) -> Any:
        target = self._resolve()
        return self._explained(lambda: target.with_call(*args, **kwargs))

    def future(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve().future(*args, **kwargs)
