"""Mutual-TLS credentials from one ServiceConfig, the single place that decides plaintext vs TLS.

Every service both serves and calls (the aggregator calls workers and the profiler, the profiler
probes workers), so each process has one certificate used both ways. Servers demand a client
certificate signed by the CA (``require_client_authentication``): an unauthenticated peer fails
the handshake before any handler runs, which is why no servicer needs a "no certificate" branch.

Server credentials are *dynamic* (``grpc.dynamic_ssl_server_credentials``): gRPC calls the
fetcher once per new connection, before the handshake. That is where TLS connections are
counted (``powertrip_tls_connections_total``), and where a rotated certificate, key or CA file
is picked up without a restart: one ``stat`` per file per connection, a re-read only when an
mtime or size changed. Clients read their files when the channel is made, so a rotated client
certificate takes effect on the next channel (the next process start, for the services).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import grpc

from services.common.auth_metrics import TLS_CONNECTIONS
from services.common.config import ServiceConfig

logger = logging.getLogger(__name__)


def _pem(path: str | None) -> bytes:
    assert path is not None  # ServiceConfig guarantees all three paths or none
    return Path(path).read_bytes()


class _CertificateFetcher:
    """Counts connections and reloads the server's certificate files when they change."""

    def __init__(self, cfg: ServiceConfig) -> None:
        self.paths = (cfg.tls_key_path, cfg.tls_cert_path, cfg.tls_ca_path)
        self._lock = threading.Lock()
        self._sig = self._signature()
        self.initial = self._load()

    def _signature(self) -> tuple[tuple[int, int], ...]:
        out = []
        for p in self.paths:
            st = os.stat(p)  # type: ignore[arg-type]
            out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _load(self) -> grpc.ServerCertificateConfiguration:
        key, cert, ca = (_pem(p) for p in self.paths)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        TLS_CONNECTIONS.inc()
        try:
            with self._lock:
                sig = self._signature()
                if sig == self._sig:
                    return None
                self._sig = sig  # a bad new version is reported once, not per connection
                fresh = self._load()
        except Exception as exc:  # a half-written or missing file: keep serving the old one
            logger.error("TLS files %s unreadable, keeping the current ones: %s", self.paths, exc)
            return None
        logger.info("TLS certificate files changed; new connections use the new ones")
        return fresh


def server_credentials(cfg: ServiceConfig) -> grpc.ServerCredentials | None:
    """mTLS server credentials, or None for plaintext (POWERTRIP_INSECURE=1)."""
    if not cfg.tls:
        return None
    fetcher = _CertificateFetcher(cfg)
    return grpc.dynamic_ssl_server_credentials(
        fetcher.initial, fetcher, require_client_authentication=True
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
