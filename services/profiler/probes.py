"""Active probes against a worker's WorkerService: small pings and one timed bulk stream."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from powertrip.services.profiler.links import bandwidth_bytes_per_s, median_rtt
from powertrip.v1 import worker_pb2, worker_pb2_grpc

PING_PAYLOAD_BYTES = 64


@dataclass(frozen=True)
class ProbeResult:
    rtt_s: float
    bandwidth_bytes_per_s: float | None  # None: not run (byte budget) or too short to tell
    bytes_moved: int  # payload bytes both ways, pings included


def measure_rtt(
    stub: worker_pb2_grpc.WorkerServiceStub, ping_count: int, timeout_s: float
) -> tuple[float, int]:
    """(median RTT of ``ping_count`` pings after one warm-up, payload bytes moved)."""
    payload = os.urandom(PING_PAYLOAD_BYTES)
    stub.Ping(worker_pb2.PingRequest(payload=payload), timeout=timeout_s)  # warm the channel
    samples = []
    for _ in range(ping_count):
        t0 = time.perf_counter()
        stub.Ping(worker_pb2.PingRequest(payload=payload), timeout=timeout_s)
        samples.append(time.perf_counter() - t0)
    return median_rtt(samples), 2 * PING_PAYLOAD_BYTES * (ping_count + 1)


def measure_bandwidth(
    stub: worker_pb2_grpc.WorkerServiceStub,
    probe_bytes: int,
    rtt_s: float,
    timeout_s: float,
    chunk_bytes: int = 1 << 20,
) -> tuple[float | None, int]:
    """(goodput worker -> profiler in bytes/s, bytes received) of one timed bulk stream; the
    goodput is None when the stream's time was too short next to ``rtt_s`` to mean anything
    (``links.bandwidth_bytes_per_s``)."""
    t0 = time.perf_counter()
    received = 0
    for msg in stub.ProbeBandwidth(
        worker_pb2.ProbeBandwidthRequest(total_bytes=probe_bytes, chunk_bytes=chunk_bytes),
        timeout=timeout_s,
    ):
        received += len(msg.data)
    elapsed = time.perf_counter() - t0
    return bandwidth_bytes_per_s(received, elapsed, rtt_s), received


def probe_worker(
    stub: worker_pb2_grpc.WorkerServiceStub,
    ping_count: int,
    probe_bytes: int,
    timeout_s: float,
    chunk_bytes: int = 1 << 20,
) -> ProbeResult:
    """RTT, then bandwidth; ``probe_bytes=0`` measures the RTT alone."""
    rtt, moved = measure_rtt(stub, ping_count, timeout_s)
    if probe_bytes <= 0:
        return ProbeResult(rtt, None, moved)
    bandwidth, received = measure_bandwidth(stub, probe_bytes, rtt, timeout_s, chunk_bytes)
    return ProbeResult(rtt, bandwidth, moved + received)
