"""Authentication metrics: refused calls, and TLS connections against authenticated ones.

``powertrip_tls_connections_total`` counts every connection a TLS port accepts (the server's
certificate fetcher runs once per new connection, before the handshake);
``powertrip_tls_authenticated_connections_total`` counts connections that then made at least one
call with a verified client certificate (a distinct ``context.peer()``). The difference is the
handshakes refused: no client certificate, a foreign CA, an expired certificate, plaintext
spoken to a TLS port (plus connections that were opened and never used).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import grpc
from prometheus_client import Counter

AUTH_DENIED = Counter(
    "powertrip_auth_denied_total",
    "Calls refused by identity rules, by service, method and reason (identity_mismatch, "
    "not_allowed, revoked, wrong_role, site_not_assigned, bad_id).",
    ["service", "method", "reason"],
)
TLS_CONNECTIONS = Counter(
    "powertrip_tls_connections_total",
    "Connections accepted on a TLS port (counted before the handshake).",
)
TLS_AUTHENTICATED = Counter(
    "powertrip_tls_authenticated_connections_total",
    "TLS connections that made at least one call with a verified client certificate.",
)

_MAX_PEERS = 4096  # peers remembered; a forgotten one that calls again is counted again
_peers: OrderedDict[str, None] = OrderedDict()
_lock = threading.Lock()


def count_denied(service: str, method: str, reason: str) -> None:
    AUTH_DENIED.labels(service, method, reason).inc()


def note_call(context: grpc.ServicerContext) -> None:
    """Count the caller's connection once if it is TLS with a verified certificate."""
    try:
        auth = context.auth_context()
        if auth.get("transport_security_type") != [b"ssl"] or not auth.get("x509_common_name"):
            return
        peer = str(context.peer())
    except Exception:  # a test double without auth context: nothing to count
        return
    with _lock:
        if peer in _peers:
            _peers.move_to_end(peer)
            return
        _peers[peer] = None
        if len(_peers) > _MAX_PEERS:
            _peers.popitem(last=False)
    TLS_AUTHENTICATED.inc()
