"""Curtailment mode's learner over the workers (``GrpcLearner``): each sub-round of
``FoldingLearner``'s round arithmetic trained by the workers hosting its sites. A site whose
update does not arrive whole is left out of its sub-round (the learner folds the sites that
reported, work-weighted); each sub-round names the elastic round it belongs to, so a worker
resets a recipe's optimizer state per round exactly as the emulator does."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from powertrip.aggregation.outer_step import NesterovOuter
from powertrip.aggregation.robust import AdaptiveBound, Aggregation
from powertrip.curtailment.learner import Evaluate, FoldingLearner
from powertrip.learning.device import TorchParams, to_numpy, to_torch
from powertrip.services.aggregator.delta_inbox import DeltaInbox
from powertrip.services.aggregator.executor import GrpcRoundExecutor
from powertrip.sites.profiles import site_id
from powertrip.state_dict import fields, integer
from powertrip.v1 import common_pb2

logger = logging.getLogger(__name__)


class GrpcLearner(FoldingLearner):
    """``FoldingLearner`` over the workers: each ``train_sites`` call is one sub-round in which
    the named sites train their stream rows from the given model on their workers."""

    def __init__(
        self,
        transport: GrpcRoundExecutor,
        params: TorchParams,
        evaluate: Evaluate,
        batch_size: int,
        run_seed: int,
        deadline_s: float,
        outer: NesterovOuter | None = None,
        aggregation: Aggregation | None = None,
    ) -> None:
        super().__init__(params, evaluate, batch_size, outer, aggregation)
        self.transport = transport
        self.run_seed = run_seed
        self.deadline_s = deadline_s
        self.sub_rounds = 0  # numbers the sub-rounds, the workers' round index
        self.round = 0  # the elastic round being trained (the workers reset a recipe by it)

    def start_round(self) -> None:
        self.round += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "sub_rounds": self.sub_rounds, "round": self.round}

    @staticmethod
    def read_counted_state(
        state: object, adaptive: bool
    ) -> tuple[AdaptiveBound | None, tuple[float, float] | None, int, int]:
        """``state_dict()``'s value, checked: (bound, evaluation, sub-rounds, rounds)."""
        d = fields(state, "learner state", {"bound", "current", "sub_rounds", "round"})
        sub_rounds = integer(d["sub_rounds"], "learner state.sub_rounds")
        round_index = integer(d["round"], "learner state.round")
        assert sub_rounds is not None and round_index is not None
        if not 0 <= round_index <= sub_rounds:
            raise ValueError(f"learner state: {sub_rounds} sub-rounds in {round_index} rounds")
        base = {"bound": d["bound"], "current": d["current"]}
        return (*FoldingLearner.read_state(base, adaptive), sub_rounds, round_index)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        got = self.read_counted_state(state, self.aggregation.adaptive)
        self.bound, self._current, self.sub_rounds, self.round = got

    def train_sites(
        self, params: TorchParams, sites: Sequence[int], rows: Sequence[NDArray[np.int64]]
    ) -> list[TorchParams | None]:
        """One sub-round on the workers; None for a site whose update did not arrive whole
        (its worker dead or unhosted, a deadline, a refused or short update: one line says
        which and why), so the sub-round folds the sites that reported."""
        self.sub_rounds += 1
        n = self.sub_rounds
        arrays = to_numpy(params)
        given = {s: math.ceil(len(r) / self.batch_size) for s, r in zip(sites, rows, strict=True)}
        inbox = DeltaInbox(n, sites, given)  # a site's weight is at most the steps it was given
        tx = self.transport
        tx.params, tx.collector = arrays, inbox  # the servicer checks updates against these
        by_site = dict(zip(sites, rows, strict=True))
        groups, orphans = tx.registry.group(list(sites))
        for s in orphans:
            inbox.fail(s, "unhosted")
        for worker_id, hosted in groups.items():
            spec = common_pb2.RoundSpec(
                round=n,
                stream_round=self.round,
                run_seed=self.run_seed,
                site_ids=[site_id(s) for s in hosted],
                deadline_seconds=self.deadline_s,
                stream_rows={
                    site_id(s): common_pb2.StreamRows(positions=by_site[s].tolist()) for s in hosted
                },
            )
            tx.send_round(inbox, worker_id, hosted, spec, arrays)
        inbox.wait(self.deadline_s)
        inbox.close()
        tx.release_broadcast()  # the sub-round's encoded model (one copy) is no longer needed
        missing = dict(inbox.failed)
        for s in sites:
            if s in inbox.deltas and inbox.weights[s] != given[s]:
                missing[s] = f"{inbox.weights[s]:g} steps reported for {given[s]}"
            elif s not in inbox.deltas and s not in missing:
                missing[s] = "no update before the deadline"
        if missing:
            why = ", ".join(f"{site_id(s)}: {r}" for s, r in sorted(missing.items()))
            left = "left to the sites that reported" if len(missing) < len(sites) else "empty"
            logger.warning(
                "round %d, sub-round %d: no update from %s; %s", self.round, n, why, left
            )
        return [None if s in missing else to_torch(inbox.deltas[s]) for s in sites]
