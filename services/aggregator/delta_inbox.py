"""Curtailment mode's update intake: each verified delta kept whole (``DeltaInbox``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from powertrip.services.aggregator.collector import RoundGate
from powertrip.services.common.fault_points import fault_point
from powertrip.services.common.tensor_receiver import VerifiedUpdate


class DeltaInbox(RoundGate):
    """One sub-round of curtailment mode: each site's verified delta, kept whole.

    Curtailment's round arithmetic (``FoldingLearner``) needs every delta on its own (a lone
    site's checkpoint models add its partial delta to the others'), so updates are not summed on
    arrival as in ``RoundCollector``; the fold happens afterwards, in work order. Same calls as
    the collector, so the servicer feeds either. Memory: one model per site of the sub-round.
    """

    def __init__(
        self,
        round_index: int,
        sites: Sequence[int],
        allowance: Mapping[int, float] | None = None,
    ) -> None:
        super().__init__(round_index, sites, allowance)
        self.deltas: dict[int, dict[str, NDArray[np.float32]]] = {}
        self.weights: dict[int, float] = {}

    def _delivered(self, site: int) -> bool:
        return site in self.deltas

    def _prepare(self, rx: VerifiedUpdate) -> dict[str, NDArray[np.float32]]:
        try:
            return rx.arrays()
        finally:
            rx.close()

    def _keep(self, site: int, item: dict[str, NDArray[np.float32]], weight: float) -> None:
        self.deltas[site], self.weights[site] = item, weight
        fault_point("aggregation", self.round)  # test hook: dies once a sub-round's update is in
