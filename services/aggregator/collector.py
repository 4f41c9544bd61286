"""One open round on the aggregator: who may submit, what arrived, the running FedAvg sums.

Updates are checked chunk by chunk while they stream in (``TensorStreamReceiver``) and folded
once the checksum matches: a stream that dies mid-way or carries a bad value never touches the
sums. Folds happen in the order the policy selected the sites (a verified update that arrives
early waits in its spool, on disk when large), so the float32 sums, and hence the run, do not
depend on network timing and equal the emulator's bit for bit. Memory stays one accumulator (two
with the split-half probe) plus a few chunks, whatever the number of concurrent uploads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from numpy.typing import NDArray

from services.aggregator.fedavg import StreamingFedAvg
from services.common.errors import Duplicate, StaleRound
from services.common.sites import site_id
from services.common.tensor_stream import TensorStreamReceiver


@dataclass
class RoundCollector:
    round: int
    selected: Sequence[int]
    template: Mapping[str, NDArray]
    split_half: bool = False
    direction: Mapping[str, NDArray] | None = None  # previous global delta, for projections
    agg: StreamingFedAvg = field(init=False)
    half: StreamingFedAvg | None = field(init=False)
    accepted: list[int] = field(default_factory=list)  # folded, in fold order
    failed: dict[int, str] = field(default_factory=dict)
    closed: bool = False

    def __post_init__(self) -> None:
        self.agg = StreamingFedAvg(self.template, direction=self.direction)
        self.half = StreamingFedAvg(self.template) if self.split_half else None
        self._half_sites = {int(s) for j, s in enumerate(self.selected) if j % 2 == 0}
        self._expected = {int(s) for s in self.selected}
        self._in_flight: set[int] = set()
        self._ready: dict[int, tuple[TensorStreamReceiver, float]] = {}
        self._next = 0  # position in ``selected`` of the next update to fold
        self._cv = threading.Condition()

    def admit(self, site: int, round_index: int) -> None:
        """Check an update header before its bytes are read."""
        with self._cv:
            if round_index != self.round or self.closed:
                state = "closed" if round_index == self.round else f"not open (open: {self.round})"
                raise StaleRound(f"round {round_index} is {state}")
            if site not in self._expected:
                raise StaleRound(f"{site_id(site)} was not selected in round {self.round}")
            if site in self.accepted or site in self._in_flight or site in self._ready:
                raise Duplicate(f"{site_id(site)} already submitted round {self.round}")
            # A rejected stream may be sent again whole while the round is open (R9).
            self.failed.pop(site, None)
            self._in_flight.add(site)

    def commit(self, site: int, rx: TensorStreamReceiver, weight: float) -> None:
        """Take a verified update (and ownership of ``rx``); it is folded in selection order."""
        with self._cv:
            self._in_flight.discard(site)
            if self.closed:
                rx.close()
                raise StaleRound(f"round {self.round} closed before {site_id(site)} finished")
            self._ready[site] = (rx, weight)
            self._drain()
            self._cv.notify_all()

    def fail(self, site: int, reason: str) -> None:
        with self._cv:
            self._in_flight.discard(site)
            if site not in self.accepted and site not in self._ready:
                self.failed.setdefault(site, reason)
            self._drain()
            self._cv.notify_all()

    def _drain(self) -> None:
        """Fold every update whose predecessors in selection order are folded (or, once the
        round is closed, failed: until then a rejected site may still resend)."""
        while self._next < len(self.selected):
            s = int(self.selected[self._next])
            if s in self._ready:
                rx, weight = self._ready.pop(s)
                try:
                    self.agg.add_pieces(rx.pieces(), weight)
                    if self.half is not None and s in self._half_sites:
                        self.half.add_pieces(rx.pieces(), weight)
                finally:
                    rx.close()
                self.accepted.append(s)
            elif not (self.closed and s in self.failed):
                return
            self._next += 1

    @property
    def done(self) -> bool:
        delivered = len(self.accepted) + len(self._ready)
        return delivered + len(self.failed) >= len(self._expected)

    def wait(self, timeout_s: float) -> bool:
        """Until every selected site delivered or failed; False on timeout."""
        end = time.monotonic() + timeout_s
        with self._cv:
            while not self.done:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return True

    def close(self) -> None:
        with self._cv:
            self.closed = True
            for s in self._expected - set(self.accepted) - self._ready.keys() - self.failed.keys():
                self.failed[s] = "deadline"
            self._drain()
            self._cv.notify_all()
