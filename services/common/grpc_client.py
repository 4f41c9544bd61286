"""Client-side conventions: one channel factory, and bounded, jittered retries for idempotent
calls only (UNAVAILABLE is the one transient code; everything else is an answer)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import grpc
from tenacity import (
    before_sleep_log,
    retry,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.grpc_options import BACKOFF_CAP_S, client_options
from powertrip.services.common.tls_channel import IdentityChannel, TlsRefused

logger = logging.getLogger(__name__)
T = TypeVar("T")


def make_channel(
    address: str, cfg: ServiceConfig, server_identity: str | None = None
) -> grpc.Channel:
    """A channel with the shared options; mutual TLS when ``cfg`` has TLS settings.

    Over TLS the server must prove it is ``server_identity`` (``identity.AGGREGATOR``,
    ``PROFILER`` or a worker id), whatever ``address`` says: any certificate of the cluster's CA
    would otherwise pass for any peer. The channel follows rotated certificate files and names
    the reason of a refused handshake (``tls_channel``). Plaintext channels check nothing, so
    only they may leave ``server_identity`` out.
    """
    if not cfg.tls:
        return grpc.insecure_channel(address, options=client_options(cfg))
    if not server_identity:
        raise ValueError(f"a TLS channel to {address} needs the identity the server must prove")
    assert cfg.tls_cert_path and cfg.tls_key_path and cfg.tls_ca_path
    return IdentityChannel(
        address,
        server_identity,
        cfg.tls_cert_path,
        cfg.tls_key_path,
        cfg.tls_ca_path,
        client_options(cfg),
    )


#: what a server over its POWERTRIP_MAX_CONCURRENT_RPCS answers (grpcio's own text): busy, not
#: a refusal of this request, unlike a RESOURCE_EXHAUSTED for an oversized message
CONCURRENCY_LIMIT = "concurrent rpc limit exceeded"


def is_unavailable(exc: BaseException) -> bool:
    """Transient, worth a retry: UNAVAILABLE, or a server at its concurrency limit.

    A failed TLS handshake is also UNAVAILABLE but will fail the same way every time (wrong CA,
    expired certificate, a server that is not who we dialled), so it is not retried, like
    Flower's ``_should_giveup_fn``. A server rejecting *our* certificate shows in gRPC only as
    "Socket closed"; ``make_channel``'s channels diagnose that and raise ``TlsRefused``."""
    if not isinstance(exc, grpc.RpcError) or isinstance(exc, TlsRefused):
        return False
    details = ((exc.details() if hasattr(exc, "details") else "") or "").lower()
    if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return CONCURRENCY_LIMIT in details
    permanent = ("handshake failed", "verification check failed")
    return exc.code() is grpc.StatusCode.UNAVAILABLE and not any(p in details for p in permanent)


def retry_idempotent(
    max_seconds: float = 30.0, max_attempts: int = 10
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Retry a call that is safe to repeat while the peer is UNAVAILABLE, with full jitter."""
    return retry(
        retry=retry_if_exception(is_unavailable),
        # full jitter, capped at BACKOFF_CAP_S: about 6 attempts in 10 s of outage, and a peer
        # that is back is found again within the cap
        wait=wait_random_exponential(multiplier=0.5, max=BACKOFF_CAP_S),
        stop=stop_after_attempt(max_attempts) | stop_after_delay(max_seconds),
        before_sleep=before_sleep_log(logger, logging.WARNING),
        reraise=True,
    )
