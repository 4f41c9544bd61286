"""Link probes under scheduling noise (reliability rows R4 and R15's flake).

Bandwidth is the bulk stream's bytes over its time less the median ping RTT. On a loaded machine
a ping can wait for a CPU while the stream does not, so the RTT can exceed the whole stream. The
probe then keeps the RTT it measured and drops only the bandwidth part (the previous estimate
stands); it never divides by a negative or near-zero time, and never discards the RTT.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import grpc
import pytest

from powertrip.services.profiler import metrics
from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.profiler.links import MIN_TRANSFER_SHARE, bandwidth_bytes_per_s
from powertrip.services.profiler.servicer import LinkProber
from powertrip.v1 import worker_pb2

pytestmark = pytest.mark.reliability("R4")
MiB = 1 << 20


@pytest.mark.parametrize(
    ("seconds", "rtt_s"),
    [
        (0.010, 0.050),  # the stream was quicker than the median ping: negative transfer
        (0.050, 0.050),  # zero
        (0.050, 0.050 * (1 - MIN_TRANSFER_SHARE / 2)),  # a sliver: the quotient would be absurd
        (0.0, 0.0),
    ],
)
def test_no_bandwidth_from_a_stream_the_rtt_swallowed(seconds, rtt_s):
    assert bandwidth_bytes_per_s(MiB, seconds, rtt_s) is None


def test_bandwidth_is_the_bytes_over_the_time_less_the_round_trip():
    assert bandwidth_bytes_per_s(4 * MiB, 1.1, 0.1) == pytest.approx(4 * MiB)
    assert bandwidth_bytes_per_s(0, 1.0, 0.1) is None


class FakeWorker:
    """A worker stub whose pings take ``ping_s`` and whose bulk stream takes ``bulk_s``."""

    def __init__(self, ping_s: float, bulk_s: float) -> None:
        self.ping_s, self.bulk_s = ping_s, bulk_s

    def Ping(self, request, timeout=None):  # noqa: N802 - the stub's method name
        time.sleep(self.ping_s)
        return worker_pb2.PingResponse(payload=request.payload)

    def ProbeBandwidth(self, request, timeout=None) -> Iterator:  # noqa: N802
        time.sleep(self.bulk_s)
        sent = 0
        while sent < request.total_bytes:
            n = min(request.chunk_bytes, request.total_bytes - sent)
            yield worker_pb2.ProbeBandwidthResponse(data=bytes(n))
            sent += n


def prober_with(fake: FakeWorker) -> LinkProber:
    prober = LinkProber(ProfilerConfig(insecure=True, ping_count=1, probe_bytes=MiB))
    prober.track("w", "127.0.0.1:1", [0])
    prober._workers["w"].stub = fake  # type: ignore[assignment]
    return prober


def test_a_stream_quicker_than_the_pings_keeps_the_rtt_and_a_sane_bandwidth():
    """Pings of 0.3 s, a bulk stream of microseconds: the old code raised, the probe counted as
    failed and the RTT was lost."""
    prober = prober_with(FakeWorker(ping_s=0.3, bulk_s=0.0))
    unusable = metrics.PROBES.labels("bandwidth_unusable")._value.get()
    prober.measure()
    link = prober.link("w")
    assert link.probes == 1 and link.rtt_s >= 0.3
    bw = link.bandwidth_bytes_per_s
    # unknown (the usual case), or, had the stream itself been held up, finite and positive
    assert (link.bandwidth_probes == 0 and bw == 0.0) or (math.isfinite(bw) and bw > 0)
    if link.bandwidth_probes == 0:
        assert metrics.PROBES.labels("bandwidth_unusable")._value.get() == unusable + 1


def test_a_noisy_probe_leaves_the_last_good_bandwidth_and_updates_the_rtt():
    fake = FakeWorker(ping_s=0.0, bulk_s=0.2)  # a good probe: about 5 MiB/s
    prober = prober_with(fake)
    prober.measure()
    good = prober.link("w").bandwidth_bytes_per_s
    assert 0 < good < 6 * MiB  # at most 1 MiB in 0.2 s less the RTT (~0)
    rtt_before = prober.link("w").rtt_s

    fake.ping_s, fake.bulk_s = 0.3, 0.0  # the pings now stall, the stream does not
    prober.measure()
    link = prober.link("w")
    assert link.probes == 2 and link.rtt_s > rtt_before
    if link.bandwidth_probes == 1:  # the noisy stream was dropped: the estimate stands
        assert link.bandwidth_bytes_per_s == good
    else:  # the stream itself was held up long enough to be timed: still finite and positive
        assert math.isfinite(link.bandwidth_bytes_per_s) and link.bandwidth_bytes_per_s > 0


def test_a_failed_bulk_stream_keeps_the_rtt_it_came_with():
    class Unavailable(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

    class Broken(FakeWorker):
        def ProbeBandwidth(self, request, timeout=None):  # noqa: N802
            raise Unavailable()

    prober = prober_with(Broken(ping_s=0.01, bulk_s=0.0))
    failed = metrics.PROBES.labels("bandwidth_failed")._value.get()
    prober.measure()
    assert prober.link("w").probes == 1 and prober.link("w").rtt_s >= 0.01
    assert metrics.PROBES.labels("bandwidth_failed")._value.get() == failed + 1
