"""Active probes against a worker's WorkerService: small pings and one timed bulk stream."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from powertrip.v1 import worker_pb2, worker_pb2_grpc
from services.profiler.links import bandwidth_bytes_per_s, median_rtt


@dataclass(frozen=True)
class ProbeResult:
    rtt_s: float
    bandwidth_bytes_per_s: float
    bytes_moved: int


def probe_worker(
    stub: worker_pb2_grpc.WorkerServiceStub,
    ping_count: int,
    probe_bytes: int,
    timeout_s: float,
    chunk_bytes: int = 1 << 20,
) -> ProbeResult:
    payload = os.urandom(64)
    samples = []
    stub.Ping(worker_pb2.PingRequest(payload=payload), timeout=timeout_s)  # warm the channel
    for _ in range(ping_count):
        t0 = time.perf_counter()
        stub.Ping(worker_pb2.PingRequest(payload=payload), timeout=timeout_s)
        samples.append(time.perf_counter() - t0)
    rtt = median_rtt(samples)
    t0 = time.perf_counter()
    received = 0
    for msg in stub.ProbeBandwidth(
        worker_pb2.ProbeBandwidthRequest(total_bytes=probe_bytes, chunk_bytes=chunk_bytes),
        timeout=timeout_s,
    ):
        received += len(msg.data)
    elapsed = time.perf_counter() - t0
    bandwidth = bandwidth_bytes_per_s(received, elapsed, rtt)
    return ProbeResult(rtt, bandwidth, received + 2 * 64 * (ping_count + 1))
