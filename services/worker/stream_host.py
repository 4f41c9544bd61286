"""The sites a worker hosts in curtailment mode: no partitions, one data stream. A round names,
per site, the stream positions to train on; the site trains exactly those rows, in order, with
the trainer the emulator's ``StreamLearner`` uses, and its update is weighted by its steps.

Each site's local optimizer state follows the recipe exactly as ``StreamLearner`` keeps it: kept
between its sub-rounds unless the recipe is plain SGD, and reset at the site's first sub-round
of each elastic round (``RoundSpec.stream_round``) when the recipe does not keep its state
(``SiteStateBook.for_round``: the step count, and so the schedule, runs on; the moments start
afresh). Under the run's update codec each sub-round's update is coded with the site's
residual, as ``StreamLearner`` codes it. With a state directory (POWERTRIP_WORKER_STATE_DIR)
the states and residuals are saved after each sub-round through the book partitioned sites
use (``state_dir.WorkerBook``: the same file, validation and setting aside of what cannot be
trusted), and a restarted worker resumes them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import torch
from numpy.typing import NDArray

from powertrip.config.curtailment import CurtailmentConfig
from powertrip.curtailment.learner import check_stream_trainer, train_stream_rows
from powertrip.federation import StreamSetup
from powertrip.learning.device import to_torch
from powertrip.learning.site_optim import SiteState
from powertrip.learning.state_book import round_key
from powertrip.services.worker.site_host import RoundJob, SiteUpdate, batched_updates
from powertrip.services.worker.state_dir import SiteStateStore, WorkerBook
from powertrip.sites.profiles import site_index
from powertrip.v1 import common_pb2


class StreamHost:
    """The ``SiteHost`` of a curtailment-mode worker."""

    mode = "curtailment"

    def __init__(
        self,
        cfg: CurtailmentConfig,
        sites: Sequence[int],
        device: torch.device | str = "auto",
        store: SiteStateStore | None = None,
    ) -> None:
        self.cfg = cfg
        self.sites = sorted(sites)
        self.setup = StreamSetup.load(cfg, device)  # the stream is resident on ``device``
        check_stream_trainer(self.setup.trainer)
        recipe = self.setup.trainer.config.recipe
        # each site's state after its sub-rounds ((elastic round, sub-round)), the newest of
        # each of its last rounds: a round redone (the aggregator resumed from a checkpoint
        # taken before it) starts from the state the site had before it. Optimizer states are
        # kept unless the recipe is plain SGD; codec residuals whenever the run codes updates.
        params = self.setup.params
        self._book = WorkerBook.for_sites(
            recipe, params, not recipe.plain_sgd, cfg, store, self.sites
        )
        self._stream_round: dict[int, int] = {}  # sub-round -> its elastic round (specs seen)

    @property
    def site_states(self) -> dict[int, SiteState] | None:
        """Each hosted site's newest optimizer state (None: the recipe carries nothing)."""
        return self._book.site_states

    @property
    def total_rows(self) -> int:
        return len(self.setup.data.y_train)

    def round_inputs(self, spec: common_pb2.RoundSpec) -> dict[int, NDArray[np.int64]]:
        """Each site's stream positions, in the spec's site order (the same batch on every
        run): a stream round must name rows for exactly its sites, and at least one each."""
        if sorted(spec.stream_rows) != sorted(spec.site_ids):
            raise ValueError("stream rows must be given for exactly the round's sites")
        rows = {
            site_index(k): np.asarray(spec.stream_rows[k].positions, dtype=np.int64)
            for k in spec.site_ids
        }
        if any(r.size == 0 for r in rows.values()):
            raise ValueError("every site of a stream round needs at least one row")
        # an aggregator that does not name the round: each sub-round a round of its own
        self._stream_round[spec.round] = spec.stream_round or spec.round
        for old in sorted(self._stream_round)[:-16]:  # specs refused after this point
            del self._stream_round[old]
        return rows

    def run_round(self, job: RoundJob) -> list[SiteUpdate]:
        if job.stream_rows is None:
            raise ValueError("a curtailment-mode round needs stream rows for its sites")
        stream_round = self._stream_round.pop(job.round, job.round)
        return self.train_rows(job.params, job.stream_rows, job.round, stream_round)

    def close(self) -> None:
        pass  # saved after every sub-round: nothing to flush

    def train_rows(
        self,
        params: Mapping[str, NDArray],
        rows: Mapping[int, NDArray[np.int64]],
        round_index: int = 0,
        stream_round: int | None = None,
    ) -> list[SiteUpdate]:
        """Train each site of ``rows`` (all hosted here) on its stream positions from ``params``
        in sub-round ``round_index`` of elastic round ``stream_round`` (None: a round of its
        own); the FedAvg weight is the site's optimizer steps (work-weighted, as in the
        emulator)."""
        foreign = sorted(set(rows) - set(self.sites))
        if foreign:
            raise ValueError(f"sites {foreign} are not hosted by this worker")
        bad = [
            s for s, r in rows.items() if len(r) == 0 or r.min() < 0 or r.max() >= self.total_rows
        ]
        if bad:
            raise ValueError(
                f"sites {bad}: stream positions empty or outside 0..{self.total_rows - 1}"
            )
        sites = list(rows)
        key = round_key(round_index if stream_round is None else stream_round, round_index)
        torch_params = to_torch(params)
        s, book = self.setup, self._book
        started = time.perf_counter()
        upd = train_stream_rows(
            s.trainer,
            s.data.x_train,
            s.data.y_train,
            s.order,
            torch_params,
            [rows[i] for i in sites],
            book.resumed(sites, key),
        )
        book.trained(sites, key, upd.opt_state)
        raw = batched_updates(sites, upd.deltas, upd.steps, 0.0)  # no loss reported
        leaving = book.leaving(raw, key, round_index)  # coded, and the book saved
        seconds = time.perf_counter() - started
        return [replace(u, train_seconds=seconds) for u in leaving]
