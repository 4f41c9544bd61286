"""Channel and server options shared by every service, derived from one ServiceConfig.

Client and server keepalive are set together (grpc doc/keepalive.md): the server must accept
pings as often as clients send them, or it answers with GOAWAY "too_many_pings". The ping timeout
is what makes a frozen (SIGSTOPped) peer visible in seconds instead of about a minute.
"""

from __future__ import annotations

from powertrip.services.common.config import ServiceConfig

MiB = 1 << 20
#: longest wait between two reconnect attempts, and between two retries (grpc_client)
BACKOFF_CAP_S = 3.0
#: how long one connection attempt (TCP + TLS handshake) may take: see client_options
CONNECT_TIMEOUT_MS = 4000


def message_limits(cfg: ServiceConfig) -> list[tuple[str, int]]:
    limit = cfg.max_message_mib * MiB
    return [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
    ]


def client_options(cfg: ServiceConfig) -> list[tuple[str, int]]:
    return [
        *message_limits(cfg),
        ("grpc.keepalive_time_ms", int(cfg.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(cfg.keepalive_timeout_s * 1000)),
        ("grpc.http2.ping_timeout_ms", int(cfg.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.enable_retries", 0),  # tenacity retries idempotent calls; never both
        # gRPC's reconnect backoff grows to 120 s by default: after a link outage of a minute a
        # peer that is back would wait minutes to be found; cap it like the retries
        ("grpc.max_reconnect_backoff_ms", int(BACKOFF_CAP_S * 1000)),
        ("grpc.initial_reconnect_backoff_ms", 1000),  # gRPC's default, then x1.6 up to the cap
        # Despite its name this is no backoff: gRPC core gives every connection attempt (TCP
        # connect + TLS handshake) until max(now + min_reconnect_backoff, the next backoff
        # time) before abandoning it (subchannel.cc, StartConnectingLocked; 1.85 has no
        # separate connect timeout). The default, 20 s, leaves an attempt whose SYN was lost in
        # a dark link hanging; 2 s abandoned TLS handshakes queued behind hundreds of others on
        # a busy server (500 registrations at once, benchmarks/registration_load.py), and their
        # retries redid the work. 4 s, because the kernel resends a SYN 1 s and 3 s into an
        # attempt: once a dark link is back, the next SYN leaves within max(2 s, 1 s + one retry
        # wait), the worst case 2 s gave too (R3); 5 s would make it 2 s + one retry wait.
        ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
    ]


def server_options(cfg: ServiceConfig) -> list[tuple[str, int]]:
    return [
        *message_limits(cfg),
        ("grpc.keepalive_time_ms", int(cfg.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(cfg.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Accept client pings up to twice as often as they are configured to come.
        ("grpc.http2.min_ping_interval_without_data_ms", int(cfg.keepalive_s * 500)),
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", cfg.stream_window_mib * MiB),
    ]
