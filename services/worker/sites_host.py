"""The sites a worker hosts: their data shards, the model, and one round of local training.

Built from the run's experiment configuration, which the aggregator hands out at registration,
so every worker partitions the same dataset the same way the emulator does and trains each site
with the same per-(run, round, site) seed: a site's update does not depend on which process
trains it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import torch
from numpy.typing import NDArray

from powertrip.config.experiment import ExperimentConfig
from powertrip.federation import build_federation, load_workload
from powertrip.learning.device import to_numpy, to_torch
from powertrip.learning.site_optim import SiteState, SiteStateLog
from powertrip.rounds.emulate import Federation, site_seed
from powertrip.services.worker.site_host import (
    RoundJob,
    SiteUpdate,
    batched_updates,
    no_stream_rows,
)
from powertrip.services.worker.state_dir import SiteStateStore, kept_after_training
from powertrip.v1 import common_pb2

__all__ = ["SiteUpdate", "SitesHost"]  # SiteUpdate: re-exported, where callers long found it

logger = logging.getLogger(__name__)


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
        # emulator keeps it (``LocalOptimizer.carries_over``). With a ``store`` (the worker's
        # state directory) it is saved after each round and resumed by a restarted worker;
        # without one it lives in memory and a restarted worker starts its sites fresh.
        # A round trained again (the aggregator resumed from before it) starts from the state
        # the site had before it: ``SiteStateLog`` keeps two rounds of history, since the
        # aggregator writes round r's checkpoint while round r+1 trains here, and a crash in
        # that write redoes round r after r+1 (one more state per site held: the price).
        self._log: SiteStateLog | None = SiteStateLog(depth=3) if recipe.carries_over else None
        self._store = store if self._log is not None else None
        if self._store is not None and self._log is not None:
            shapes = {k: tuple(v.shape) for k, v in self._fed.initial_params.items()}
            device_of = next(iter(self._fed.initial_params.values())).device
            for site, state in self._store.load(shapes, self.sites, device_of).items():
                self._log.record(site, -1, state)  # from before this process: any round's start

    def round_inputs(self, spec: common_pb2.RoundSpec) -> None:
        no_stream_rows(spec)

    def run_round(self, job: RoundJob) -> list[SiteUpdate]:
        return self.train(job.params, job.round, job.sites)

    def close(self) -> None:
        pass  # memory only

    @property
    def site_states(self) -> dict[int, SiteState] | None:
        """Each hosted site's newest optimizer state (None: the recipe carries nothing)."""
        return None if self._log is None else self._log.latest()

    def _resumed(self, site: int, round_index: int) -> SiteState | None:
        assert self._log is not None
        try:
            st = self._log.before(site, round_index)
        except LookupError as exc:  # a redo further back than the history kept
            logger.warning("%s; it starts this round fresh", exc)
            st = None
        return None if st is None else st.for_round(self._fed.trainer.config.recipe)

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
        fed = self._fed
        torch_params = to_torch(params)
        started = time.perf_counter()
        updates = fed.trainer.train(
            torch_params,
            fed.x_train,
            fed.y_train,
            [fed.partitions[s] for s in sites],
            [site_seed(self.run_seed, round_index, s) for s in sites],
            None if self._log is None else [self._resumed(s, round_index) for s in sites],
        )
        if self._log is not None and updates.opt_state is not None:
            for site, state in zip(sites, updates.opt_state, strict=True):
                self._log.record(site, round_index, kept_after_training(site, round_index, state))
            if self._store is not None:  # before any update leaves: a commit implies it
                self._store.save(self._log.latest(), round_index)
        seconds = time.perf_counter() - started
        return batched_updates(sites, updates.deltas, updates.num_samples, seconds, updates.loss)
