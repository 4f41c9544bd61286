"""One open round on the aggregator: who may submit, what arrived, the running FedAvg sums.

Updates are checked chunk by chunk while they stream in (``TensorStreamReceiver``) and folded
into the sums once the checksum matches, one at a time under a lock: a stream that dies mid-way
or carries a bad value never touches the sums, and memory stays one accumulator (two with the
split-half probe) plus a few chunks, whatever the number of concurrent uploads.
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
    agg: StreamingFedAvg = field(init=False)
    half: StreamingFedAvg | None = field(init=False)
    accepted: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    closed: bool = False

    def __post_init__(self) -> None:
        self.agg = StreamingFedAvg(self.template)
        self.half = StreamingFedAvg(self.template) if self.split_half else None
        self._half_sites = {int(s) for j, s in enumerate(self.selected) if j % 2 == 0}
        self._expected = {int(s) for s in self.selected}
        self._in_flight: set[int] = set()
        self._cv = threading.Condition()

    def admit(self, site: int, round_index: int) -> None:
        """Check an update header before its bytes are read."""
        with self._cv:
            if round_index != self.round or self.closed:
                state = "closed" if round_index == self.round else f"not open (open: {self.round})"
                raise StaleRound(f"round {round_index} is {state}")
            if site not in self._expected:
                raise StaleRound(f"{site_id(site)} was not selected in round {self.round}")
            if site in self.accepted or site in self._in_flight:
                raise Duplicate(f"{site_id(site)} already submitted round {self.round}")
            if site in self.failed:
                raise StaleRound(f"{site_id(site)} was dropped from round {self.round}")
            self._in_flight.add(site)

    def commit(self, site: int, rx: TensorStreamReceiver, weight: float) -> None:
        """Fold a verified update; a round closed in the meantime refuses it."""
        with self._cv:
            self._in_flight.discard(site)
            if self.closed:
                raise StaleRound(f"round {self.round} closed before {site_id(site)} finished")
            self.agg.add_pieces(rx.pieces(), weight)
            if self.half is not None and site in self._half_sites:
                self.half.add_pieces(rx.pieces(), weight)
            self.accepted.append(site)
            self._cv.notify_all()

    def fail(self, site: int, reason: str) -> None:
        with self._cv:
            self._in_flight.discard(site)
            if site not in self.accepted:
                self.failed.setdefault(site, reason)
            self._cv.notify_all()

    @property
    def done(self) -> bool:
        return len(self.accepted) + len(self.failed) >= len(self._expected)

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
            for s in self._expected - set(self.accepted) - self.failed.keys():
                self.failed[s] = "deadline"
            self._cv.notify_all()
