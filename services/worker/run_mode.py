"""Which ``SiteHost`` a worker trains through, chosen once from the run it joins.

The aggregator's registration reply names the run's mode and carries its configuration; the
worker's own settings say how its sites train (``POWERTRIP_SITE_RANKS``: in process, or each
site as a distributed job). Everything mode-specific after this point is the host's.
"""

from __future__ import annotations

from typing import Protocol

from powertrip.config.curtailment import CurtailmentConfig
from powertrip.config.experiment import ExperimentConfig
from powertrip.services.worker.config import WorkerConfig
from powertrip.services.worker.site_host import SiteHost
from powertrip.services.worker.state_dir import SavedRun, WorkerStateDir

__all__ = ["UnsupportedMode", "host_for_reply", "partition_host"]


class UnsupportedMode(ValueError):
    """The run's mode and this worker's settings do not go together."""


class RunReply(Protocol):  # the fields of RegisterWorkerResponse a host is built from
    mode: str
    run_config_json: str
    run_seed: int
    curtail_config_json: str


def partition_host(
    run: SavedRun, cfg: WorkerConfig, device: str, state: WorkerStateDir | None
) -> SiteHost:
    """The host of a partitioned (``powertrip``-mode) run: in process, or one distributed job
    per site when the worker has ``site_ranks``."""
    run_cfg = ExperimentConfig.model_validate_json(run.run_config_json)
    engine = cfg.site_engine
    store = state.store(run) if state is not None else None
    if engine is not None:
        from powertrip.services.worker.distributed_host import (
            DistributedSitesHost,  # spawns processes
        )

        return DistributedSitesHost(run_cfg, run.run_seed, cfg.site_indices, device, engine, store)
    from powertrip.services.worker.sites_host import SitesHost  # torch: loaded once a run is known

    return SitesHost(run_cfg, run.run_seed, cfg.site_indices, device, store)


def host_for_reply(
    reply: RunReply, cfg: WorkerConfig, device: str, state: WorkerStateDir | None
) -> SiteHost:
    """The host for the run a registration reply describes (a partitioned run is saved to
    ``state`` first, so a restarted worker rebuilds it before reaching the aggregator)."""
    if reply.mode == "curtailment":
        if cfg.site_engine is not None:
            raise UnsupportedMode(
                "POWERTRIP_SITE_RANKS is set, but a curtailment-mode run trains its sites on "
                "one data stream in process; unset it (0) for this run"
            )
        from powertrip.services.worker.stream_host import StreamHost

        curtail = CurtailmentConfig.model_validate_json(reply.curtail_config_json)
        run = SavedRun(reply.curtail_config_json, reply.run_seed)  # the states' identity
        return StreamHost(curtail, cfg.site_indices, device, state.store(run) if state else None)
    run = SavedRun(reply.run_config_json, reply.run_seed)
    if state is not None:
        state.save_run(run)
    return partition_host(run, cfg, device, state)
