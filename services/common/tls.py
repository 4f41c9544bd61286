"""Mutual-TLS credentials from one ServiceConfig, the single place that decides plaintext vs TLS.

Every service both serves and calls (the aggregator calls workers and the profiler, the profiler
probes workers), so each process has one certificate used both ways. Servers demand a client
certificate signed by the CA (``require_client_authentication``): an unauthenticated peer fails
the handshake before any handler runs, which is why no servicer needs a "no certificate" branch.

Server credentials are *dynamic* (``grpc.dynamic_ssl_server_credentials``): gRPC calls the
fetcher once per new connection, before the handshake. That is where TLS connections are
counted (``powertrip_tls_connections_total``), and where a rotated certificate, key or CA file
is picked up without a restart: one ``stat`` per file per connection, a re-read only when an
mtime or size changed (a certificate whose key is not yet replaced is read again next time).
Clients follow their files too (``tls_channel.IdentityChannel``).

A refused handshake is logged by nobody per connection (gRPC's core logs it at INFO, which
``services/__init__`` turns off with ``GRPC_VERBOSITY=ERROR``): instead the fetcher logs one
summary line per ``REFUSED_SUMMARY_S`` from the connection and authentication counters.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import grpc
from prometheus_client import Counter

from powertrip.services.common.auth_metrics import TLS_AUTHENTICATED, TLS_CONNECTIONS
from powertrip.services.common.cert_check import pair_mismatch
from powertrip.services.common.config import ServiceConfig

logger = logging.getLogger(__name__)
REFUSED_SUMMARY_S = 60.0  # at most one "handshakes refused" line per this long
REFUSED_FIRST = 20  # ... and the first as soon as a window has this many (a flood is news)


def _required(path: str | None) -> str:
    assert path is not None  # ServiceConfig guarantees all three paths or none
    return path


def _pem(path: str | None) -> bytes:
    return Path(_required(path)).read_bytes()


class _CertificateFetcher:
    """Counts connections and reloads the server's certificate files when they change."""

    def __init__(self, cfg: ServiceConfig) -> None:
        self.paths = [_required(p) for p in (cfg.tls_key_path, cfg.tls_cert_path, cfg.tls_ca_path)]
        self._lock = threading.Lock()
        self._sig = self._signature()
        self.initial = self._load()
        self.refused = RefusedSummary()

    def _signature(self) -> tuple[tuple[int, int], ...]:
        out = []
        for p in self.paths:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _load(self) -> grpc.ServerCertificateConfiguration | None:
        key, cert, ca = (_pem(p) for p in self.paths)
        if pair_mismatch(cert, key):
            return None  # caught mid-rotation: one file new, the other not yet
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        TLS_CONNECTIONS.inc()
        self.refused.tick()
        try:
            with self._lock:
                sig = self._signature()
                if sig == self._sig:
                    return None
                fresh = self._load()
                if fresh is None:
                    return None  # look again on the next connection
                self._sig = sig  # a bad new version is reported once, not per connection
        except Exception as exc:  # a half-written or missing file: keep serving the old one
            logger.error("TLS files %s unreadable, keeping the current ones: %s", self.paths, exc)
            return None
        logger.info("TLS certificate files changed; new connections use the new ones")
        return fresh


class RefusedSummary:
    """One line now and then instead of one per refused handshake: connections accepted minus
    connections that made an authenticated call, since the last line (an estimate: a connection
    that has not made its first call yet counts as refused until it does)."""

    def __init__(self, interval_s: float = REFUSED_SUMMARY_S, first: int = REFUSED_FIRST) -> None:
        self.interval_s, self.first = interval_s, first
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._base = _counts()
        self._early = False  # this window's early line was logged

    def tick(self) -> None:
        """Called per new connection (not yet counted as authenticated, so left out)."""
        now = time.monotonic()
        with self._lock:
            conns, auth = _counts()
            refused = int((conns - 1 - self._base[0]) - (auth - self._base[1]))
            ended = now - self._start >= self.interval_s
            early = not ended and not self._early and refused >= self.first
            if not (ended or early):
                return
            seconds = now - self._start
            self._base = (conns - 1, auth)
            self._early = early
            if ended:
                self._start = now
        if refused > 0:
            logger.warning(
                "%d TLS connections in %.0f s made no authenticated call: refused handshakes "
                "(no, foreign or expired client certificate; plaintext) or unused ones%s",
                refused,
                seconds,
                "; the rest of this minute comes in one more line" if early else "",
            )


def _counts() -> tuple[float, float]:
    return _total(TLS_CONNECTIONS), _total(TLS_AUTHENTICATED)


def _total(counter: Counter) -> float:
    """A label-less counter's value through prometheus-client's public ``collect``."""
    (metric,) = counter.collect()
    return next(s.value for s in metric.samples if s.name.endswith("_total"))


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
