"""One sub-round of curtailment mode on the aggregator: each site's verified delta, kept whole.

Curtailment's round arithmetic (``FoldingLearner``) needs every delta on its own (a lone site's
checkpoint models add its partial delta to the others'), so updates are not summed on arrival
as in ``RoundCollector``; the fold happens afterwards, in work order. Same calls as the
collector, so the servicer feeds either. Memory: one model per site of the sub-round.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from services.common.errors import Duplicate, StaleRound
from services.common.sites import site_id
from services.common.tensor_stream import TensorStreamReceiver


class DeltaInbox:
    def __init__(self, round_index: int, sites: Sequence[int]) -> None:
        self.round = round_index
        self.expected = [int(s) for s in sites]
        self.deltas: dict[int, dict[str, NDArray[np.float32]]] = {}
        self.weights: dict[int, float] = {}
        self.failed: dict[int, str] = {}
        self.closed = False
        self._in_flight: set[int] = set()
        self._cv = threading.Condition()

    def admit(self, site: int, round_index: int) -> None:
        with self._cv:
            if round_index != self.round or self.closed:
                state = "closed" if round_index == self.round else f"not open (open: {self.round})"
                raise StaleRound(f"round {round_index} is {state}")
            if site not in self.expected:
                raise StaleRound(f"{site_id(site)} is not in round {self.round}")
            if site in self.deltas or site in self._in_flight:
                raise Duplicate(f"{site_id(site)} already submitted round {self.round}")
            self.failed.pop(site, None)
            self._in_flight.add(site)

    def commit(self, site: int, rx: TensorStreamReceiver, weight: float) -> None:
        try:
            arrays = rx.arrays()
        finally:
            rx.close()
        with self._cv:
            self._in_flight.discard(site)
            if self.closed:
                raise StaleRound(f"round {self.round} closed before {site_id(site)} finished")
            self.deltas[site], self.weights[site] = arrays, weight
            self._cv.notify_all()

    def fail(self, site: int, reason: str) -> None:
        with self._cv:
            self._in_flight.discard(site)
            if site not in self.deltas:
                self.failed.setdefault(site, reason)
            self._cv.notify_all()

    def wait(self, timeout_s: float) -> bool:
        """Until every site delivered or failed; False on timeout."""
        end = time.monotonic() + timeout_s
        with self._cv:
            while len(self.deltas) + len(self.failed) < len(self.expected):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return True

    def close(self) -> None:
        with self._cv:
            self.closed = True
            for s in self.expected:
                if s not in self.deltas:
                    self.failed.setdefault(s, "deadline")
            self._cv.notify_all()
