"""Mutual-TLS credentials from one ServiceConfig, the single place that decides plaintext vs TLS.

Every service both serves and calls (the aggregator calls workers and the profiler, the profiler
probes workers), so each process has one certificate used both ways. Servers demand a client
certificate signed by the CA (``require_client_auth``): an unauthenticated peer fails the handshake
before any handler runs, which is why no servicer needs a "no certificate" branch.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from services.common.config import ServiceConfig


def _pem(path: str | None) -> bytes:
    assert path is not None  # ServiceConfig guarantees all three paths or none
    return Path(path).read_bytes()


def server_credentials(cfg: ServiceConfig) -> grpc.ServerCredentials | None:
    """mTLS server credentials, or None for plaintext (no TLS settings)."""
    if not cfg.tls:
        return None
    return grpc.ssl_server_credentials(
        [(_pem(cfg.tls_key_path), _pem(cfg.tls_cert_path))],
        root_certificates=_pem(cfg.tls_ca_path),
        require_client_auth=True,
    )


def channel_credentials(cfg: ServiceConfig) -> grpc.ChannelCredentials | None:
    """Client credentials presenting this service's certificate, or None for plaintext."""
    if not cfg.tls:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_pem(cfg.tls_ca_path),
        private_key=_pem(cfg.tls_key_path),
        certificate_chain=_pem(cfg.tls_cert_path),
    )
