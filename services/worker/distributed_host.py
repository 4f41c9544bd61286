"""A worker whose one site is a GPU cluster: the site trains as a ``torch.distributed`` job over
``POWERTRIP_SITE_RANKS`` rank processes (``powertrip.learning.site_engine.SiteGroup``).

The run is the same partitioned run the in-process host trains: the same partition, the same
per-(run, round, site) batch order (``site_schedule``) and the same recipe, so the site engine
is an execution choice, not another study. The rank processes keep the model and the optimizer
between rounds; a rank that dies fails this site's round (the aggregator sees a failed site,
as for any upload that never comes) and fresh ranks train the next one, resuming the site's
optimizer state (the group keeps it outside the ranks, in its moment files: the ranks' form of
the site's ``SiteState``, which the ``SiteStateBook`` holds as it holds any host's). With a
``SiteStateStore`` (the worker's state directory) the book is also saved after each round and
resumed by a restarted worker, as the in-process host does. With N > 1 ranks the update leaves
as N shard streams, one per rank (``SiteUpdate.shards``), each coded with the run's codec.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from powertrip.config.experiment import ExperimentConfig
from powertrip.config.site_engine import SiteEngineConfig
from powertrip.federation import build_federation, load_workload, site_model_factory
from powertrip.learning.device import to_numpy, to_torch
from powertrip.learning.engines import LocalRound
from powertrip.learning.site_engine.engine import RankEngine
from powertrip.learning.site_engine.group import RankFailed, SiteGroup
from powertrip.learning.state_book import round_key
from powertrip.rounds.emulate import site_seed
from powertrip.services.worker.site_host import RoundJob, SiteUpdate, no_stream_rows
from powertrip.services.worker.state_dir import SiteStateStore, WorkerBook
from powertrip.sites.profiles import site_id
from powertrip.v1 import common_pb2

logger = logging.getLogger(__name__)

__all__ = ["DistributedSitesHost"]


class DistributedSitesHost:
    """The ``SiteHost`` of a worker training one site over several devices."""

    mode = "powertrip"

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_seed: int,
        sites: Sequence[int],
        device: str,
        engine: SiteEngineConfig,
        store: SiteStateStore | None = None,
    ) -> None:
        if len(sites) != 1 or not 0 <= sites[0] < cfg.num_sites:
            raise ValueError(
                f"a distributed site host trains exactly one of the run's {cfg.num_sites} "
                f"sites, not {list(sites)}"
            )
        self.sites = [int(sites[0])]
        self.run_seed = run_seed
        data = load_workload(cfg, seed=cfg.seed)
        fed = build_federation(cfg, data, run_seed, "cpu")  # the data stays on the host
        self._local = fed.trainer.config
        self._template = to_numpy(fed.initial_params)
        self._part = np.asarray(fed.partitions[self.sites[0]], dtype=np.int64)
        rows = data.x_train[self._part], data.y_train[self._part]  # the site's samples only
        recipe = self._local.recipe
        # the site's optimizer state and codec residual, resumed from an earlier process of
        # this worker when there is one
        self._book = WorkerBook.for_sites(
            recipe, self._template, recipe.carries_over, cfg, store, self.sites
        )
        self.group = SiteGroup(
            site_model_factory(cfg, data, fed.trainer.model),
            *rows,
            self._local.recipe,
            engine,
            device=device,
            site=site_id(self.sites[0]),
        )
        self._rows = rows
        self._engine = RankEngine(self.group, self._local)  # the site trains through the seam
        self.group.start()  # the ranks' start-up (torch import, model build) before round 1
        logger.info(
            "site %s trains over %d %s rank(s) (%s)",
            site_id(self.sites[0]),
            engine.ranks,
            self.group.device_type,
            engine.sharding,
        )

    @property
    def template(self) -> dict[str, NDArray]:
        return self._template

    def round_inputs(self, spec: common_pb2.RoundSpec) -> None:
        no_stream_rows(spec)

    def run_round(self, job: RoundJob) -> list[SiteUpdate]:
        """The round's update of the one site; ``RankFailed`` (the round fails on this worker
        and the runner logs it) when a rank dies or the round outlives its deadline."""
        (site,) = job.sites
        if site != self.sites[0]:
            raise ValueError(f"site {site_id(site)} is not hosted by this worker")
        seed = site_seed(self.run_seed, job.round, site)  # site_schedule's batch order
        left = job.received_at + job.deadline_s - time.monotonic()
        own = [np.arange(len(self._part))]  # the site's rows, all of them
        key, book = round_key(job.round), self._book
        state = (book.resumed([site], key) or [None])[0]  # the last round's: still in the ranks
        sites = LocalRound(to_torch(job.params), *self._rows, own, [seed], [state])
        try:
            upd = self._engine.train(sites, deadline_s=max(left, 1.0), round_index=job.round)
        except RankFailed:  # this round is lost; fresh ranks now, not in the next one's time
            self._restart()
            raise
        result = self._engine.last
        assert result is not None  # train() keeps its round's result
        kept = book.trained([site], key, upd.opt_state)
        if kept and upd.opt_state and kept[0] is not upd.opt_state[0]:  # non-finite moments:
            self.group.load_state(kept[0])  # fresh ones now, not kept
        many = self.group.config.ranks > 1
        update = SiteUpdate(
            site=site,
            delta=to_numpy(result.delta),
            num_samples=float(len(self._part)),  # n_i, as the in-process host weighs it
            train_seconds=result.seconds,
            loss=float(result.loss),
            shards=[to_numpy(s) for s in result.shards] if many else None,
        )
        return book.leaving([update], key, job.round)  # coded, and the book saved first

    def _restart(self) -> None:
        try:
            self.group.start()
        except Exception as exc:  # the next round tries again
            logger.warning("site %s: fresh ranks failed to start: %s", self.group.site, exc)

    def close(self) -> None:
        self.group.close()
