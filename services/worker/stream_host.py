"""The sites a worker hosts in curtailment mode: no partitions, one data stream. A round names,
per site, the stream positions to train on; the site trains exactly those rows, in order, with
the trainer the emulator's ``StreamLearner`` uses, and its update is weighted by its steps."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from numpy.typing import NDArray

from powertrip.curtailment.config import CurtailmentConfig
from powertrip.curtailment.learner import check_stream_trainer, train_stream_rows
from powertrip.learning.device import row_to_numpy, to_torch
from powertrip.learning.federation import StreamSetup
from powertrip.learning.site_optim import SiteState
from powertrip.services.worker.site_host import RoundJob, SiteUpdate
from powertrip.services.worker.state_dir import kept_after_training
from powertrip.sites import site_index
from powertrip.v1 import common_pb2


class StreamHost:
    """The ``SiteHost`` of a curtailment-mode worker."""

    mode = "curtailment"

    def __init__(
        self, cfg: CurtailmentConfig, sites: Sequence[int], device: torch.device | str = "auto"
    ) -> None:
        self.cfg = cfg
        self.sites = sorted(sites)
        self.setup = StreamSetup.load(cfg, device)  # the stream is resident on ``device``
        check_stream_trainer(self.setup.trainer)
        recipe = self.setup.trainer.config.recipe
        # Each site's local optimizer state across the sub-rounds that train it, in memory, for
        # a recipe that keeps its moments (the emulator's StreamLearner keeps it alike). A
        # recipe that resets them every round starts each sub-round fresh here: the worker is
        # not told which sub-rounds begin a round (a lone site's checkpoint chunks do not).
        self.site_states: dict[int, SiteState] | None = (
            {} if recipe.keep_state and recipe.carries_over else None
        )

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
        return rows

    def run_round(self, job: RoundJob) -> list[SiteUpdate]:
        if job.stream_rows is None:
            raise ValueError("a curtailment-mode round needs stream rows for its sites")
        return self.train_rows(job.params, job.stream_rows, job.round)

    def close(self) -> None:
        pass  # memory only

    def train_rows(
        self,
        params: Mapping[str, NDArray],
        rows: Mapping[int, NDArray[np.int64]],
        round_index: int = 0,
    ) -> list[SiteUpdate]:
        """Train each site of ``rows`` (all hosted here) on its stream positions from ``params``;
        the FedAvg weight is the site's optimizer steps (work-weighted, as in the emulator)."""
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
        torch_params = to_torch(params)
        s = self.setup
        started = time.perf_counter()
        upd = train_stream_rows(
            s.trainer,
            s.data.x_train,
            s.data.y_train,
            s.order,
            torch_params,
            [rows[i] for i in sites],
            None if self.site_states is None else [self.site_states.get(i) for i in sites],
        )
        if self.site_states is not None and upd.opt_state is not None:
            for site, state in zip(sites, upd.opt_state, strict=True):
                self.site_states[site] = kept_after_training(site, round_index, state)
        seconds = time.perf_counter() - started
        return [
            SiteUpdate(
                site=site,
                delta=row_to_numpy(upd.deltas, j),
                num_samples=float(upd.steps[j]),
                train_seconds=seconds,
            )
            for j, site in enumerate(sites)
        ]
