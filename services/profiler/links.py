"""Link estimates from active probes: RTT as a median, bandwidth from a timed bulk transfer,
both smoothed so one noisy probe does not reorder the ranking."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def median_rtt(samples_s: Sequence[float]) -> float:
    """The median resists the one round trip that hit a GC pause or a queue."""
    if not samples_s:
        raise ValueError("no RTT samples")
    return float(statistics.median(samples_s))


#: a transfer time below this share of the stream's elapsed time is noise, not a measurement
MIN_TRANSFER_SHARE = 0.05


def bandwidth_bytes_per_s(nbytes: int, seconds: float, rtt_s: float = 0.0) -> float | None:
    """Goodput of a bulk stream of ``nbytes`` that took ``seconds``, the request's own round
    trip (``rtt_s``) not counted as transfer time; None when that leaves no usable time.

    The RTT is a median of separate pings, so on a busy machine it can exceed the whole stream
    (a ping waited for a CPU, the stream did not): the difference is then negative or a sliver
    whose quotient would be absurd. Such a stream says nothing about the link; the caller keeps
    its RTT and its previous bandwidth estimate."""
    if nbytes <= 0 or seconds <= 0:
        return None
    transfer = seconds - rtt_s
    if transfer < MIN_TRANSFER_SHARE * seconds:
        return None
    return nbytes / transfer


@dataclass
class LinkEstimate:
    """Exponentially smoothed RTT and bandwidth of one worker's link."""

    smoothing: float = 0.5
    rtt_s: float = 0.0
    bandwidth_bytes_per_s: float = 0.0
    measured_at_s: float = 0.0
    probes: int = 0
    bandwidth_probes: int = 0

    def update(self, rtt_s: float, bandwidth: float | None, now_s: float) -> None:
        """Fold in one probe; ``bandwidth=None`` (a probe the byte budget cut to pings) keeps the
        bandwidth estimate as it was."""
        a = self.smoothing
        self.rtt_s = rtt_s if self.probes == 0 else a * rtt_s + (1 - a) * self.rtt_s
        if bandwidth is not None:
            old = self.bandwidth_bytes_per_s
            first = self.bandwidth_probes == 0
            self.bandwidth_bytes_per_s = bandwidth if first else a * bandwidth + (1 - a) * old
            self.bandwidth_probes += 1
        self.measured_at_s = now_s
        self.probes += 1
