"""The sites a worker hosts: their data shards, the model, and one round of local training.

Built from the run's experiment configuration, which the aggregator hands out at registration,
so every worker partitions the same dataset the same way the emulator does and trains each site
with the same per-(run, round, site) seed: a site's update does not depend on which process
trains it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch
from numpy.typing import NDArray

from powertrip.config.experiment import ExperimentConfig
from powertrip.federation import build_federation, load_workload
from powertrip.learning.device import to_numpy, to_torch
from powertrip.learning.site_optim import SiteState
from powertrip.learning.state_book import round_key
from powertrip.rounds.emulate import Federation, site_seed
from powertrip.services.worker.site_host import (
    RoundJob,
    SiteUpdate,
    batched_updates,
    no_stream_rows,
)
from powertrip.services.worker.state_dir import SiteStateStore, WorkerBook
from powertrip.v1 import common_pb2

__all__ = ["SiteUpdate", "SitesHost"]  # SiteUpdate: re-exported, where callers long found it


class SitesHost:
    """Partitioned sites (the paper's mode), trained together in this process: the
    ``SiteHost`` for a worker with the in-process engine."""

    mode = "powertrip"

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_seed: int,
        sites: Sequence[int],
        device: torch.device | str = "auto",
        store: SiteStateStore | None = None,
    ) -> None:
        bad = [s for s in sites if not 0 <= s < cfg.num_sites]
        if bad:
            raise ValueError(
                f"sites {bad} are outside this run's {cfg.num_sites} sites (0..{cfg.num_sites - 1})"
            )
        self.cfg = cfg
        self.run_seed = run_seed
        self.sites = sorted(sites)
        data = load_workload(cfg, seed=cfg.seed)
        self._fed: Federation = build_federation(cfg, data, run_seed, device)  # data resident
        recipe = self._fed.trainer.config.recipe
        # each hosted site's local optimizer state between the rounds that pick it, as the
        # emulator keeps it (``LocalOptimizer.carries_over``), and its codec residual. With a
        # ``store`` (the worker's state directory) they are saved after each round and resumed
        # by a restarted worker; without one they live in memory and a restarted worker starts
        # its sites fresh. A round trained again (the aggregator resumed from before it)
        # starts from what the site had before it (``ROUNDS_KEPT`` rounds of history).
        params = self._fed.initial_params
        self._book = WorkerBook.for_sites(
            recipe, params, recipe.carries_over, cfg, store, self.sites
        )

    def round_inputs(self, spec: common_pb2.RoundSpec) -> None:
        no_stream_rows(spec)

    def run_round(self, job: RoundJob) -> list[SiteUpdate]:
        return self.train(job.params, job.round, job.sites)

    def close(self) -> None:
        pass  # memory only

    @property
    def site_states(self) -> dict[int, SiteState] | None:
        """Each hosted site's newest optimizer state (None: the recipe carries nothing)."""
        return self._book.site_states

    @property
    def template(self) -> dict[str, NDArray]:
        return to_numpy(self._fed.initial_params)

    def train(
        self, params: Mapping[str, NDArray], round_index: int, sites: Sequence[int]
    ) -> list[SiteUpdate]:
        """Train ``sites`` (all hosted here) for one round from ``params``."""
        foreign = sorted(set(sites) - set(self.sites))
        if foreign:
            raise ValueError(f"sites {foreign} are not hosted by this worker")
        fed, book, key = self._fed, self._book, round_key(round_index)
        torch_params = to_torch(params)
        started = time.perf_counter()
        updates = fed.trainer.train(
            torch_params,
            fed.x_train,
            fed.y_train,
            [fed.partitions[s] for s in sites],
            [site_seed(self.run_seed, round_index, s) for s in sites],
            book.resumed(sites, key),
        )
        book.trained(sites, key, updates.opt_state)
        raw = batched_updates(sites, updates.deltas, updates.num_samples, 0.0, updates.loss)
        leaving = book.leaving(raw, key, round_index)  # coded, and the book saved
        seconds = time.perf_counter() - started
        return [replace(u, train_seconds=seconds) for u in leaving]
