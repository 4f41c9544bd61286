"""powertrip-aggregator: register workers, run rounds, serve status and metrics."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.common.command_line import parse_service_args
from powertrip.services.common.config import ConfigError, env_name, load_config

if TYPE_CHECKING:
    from powertrip.services.aggregator.lifecycle import Run

logger = logging.getLogger("powertrip.services.aggregator")
SERVICE = "powertrip.v1.AggregatorService"
#: the exit code of a FAILED run (every worker lost, sites never came, a crash): restart-worthy
EXIT_RUN_FAILED = 4


def runs() -> dict[str, Callable[[AggregatorConfig], Run]]:
    """The run of each POWERTRIP_MODE (imported here: torch and the training code)."""
    from powertrip.services.aggregator.curtail_run import CurtailmentRun
    from powertrip.services.aggregator.run import AggregatorRun

    return {"powertrip": AggregatorRun, "curtailment": CurtailmentRun}


def recipe_source(cfg: AggregatorConfig) -> str:
    """Where the run's local optimizer came from: the variable as given, or the preset's."""
    var = env_name("local_optimizer")
    if given := os.environ.get(var):
        return f"{var}={given!r}"
    if cfg.mode == "curtailment":
        return f"the local optimizer of {env_name('curtail_preset')}={cfg.curtail_preset}"
    return f"the local optimizer of {env_name('preset')}={cfg.preset}"


def main() -> int:
    parse_service_args("powertrip-aggregator", AggregatorConfig, __doc__)
    # the service itself (gRPC, torch, the training code): only once --help is not asked for
    from powertrip.config.recipe import RecipeTooLong
    from powertrip.services.aggregator.checkpoint import NoUsableCheckpoint
    from powertrip.services.aggregator.run_status import RunState
    from powertrip.services.aggregator.service_handlers import add_to_server
    from powertrip.services.aggregator.servicer import AggregatorServicer
    from powertrip.services.aggregator.worker_tracker import WorkerTracker
    from powertrip.services.common.fault_points import armed_faults
    from powertrip.services.common.grpc_client import make_channel, retry_idempotent
    from powertrip.services.common.grpc_server import exit_process, serve, start_server
    from powertrip.services.common.identity import PROFILER
    from powertrip.services.common.logging import configure
    from powertrip.services.common.memory import pin_mmap_threshold
    from powertrip.services.common.metrics import start_metrics_server
    from powertrip.services.env_names import warn_unknown_names
    from powertrip.v1 import profiler_pb2, profiler_pb2_grpc

    try:
        cfg = load_config(AggregatorConfig)
        cfg.curtailment() if cfg.mode == "curtailment" else cfg.experiment()
        cfg.usable_device()  # it evaluates there: no GPU, no start
        armed_faults()  # a test hook's typo fails here, not silently
    except (ConfigError, ValueError) as exc:
        print(f"powertrip-aggregator: {exc}", file=sys.stderr)
        return 2
    configure("aggregator", cfg.log_level)
    warn_unknown_names("aggregator")
    pin_mmap_threshold()  # bounded RSS under many concurrent large uploads
    import torch

    torch.set_num_threads(1)
    metrics_port = start_metrics_server(cfg.metrics_port, cfg.metrics_addr)
    try:
        run = runs()[cfg.mode](cfg)
    except NoUsableCheckpoint as exc:  # a crash loop would not fix it: say so once, exit
        logger.error("%s", exc)
        return 3
    except RecipeTooLong as exc:  # a config error known once the data is split: still pre-READY
        print(f"powertrip-aggregator: {recipe_source(cfg)}: {exc}", file=sys.stderr)
        return 2
    profiler = profiler_pb2_grpc.ProfilerServiceStub(make_channel(cfg.profiler_addr, cfg, PROFILER))

    @retry_idempotent(max_seconds=60)
    def track_worker(worker_id: str, address: str, sites: list[str]) -> None:
        profiler.TrackWorker(
            profiler_pb2.TrackWorkerRequest(worker_id=worker_id, address=address, site_ids=sites),
            timeout=cfg.rpc_timeout_s,
        )

    def track_quietly(worker_id: str, address: str, sites: list[str]) -> None:
        try:
            track_worker(worker_id, address, sites)
        except Exception as exc:  # the run goes on with modelled links
            logger.warning("profiler did not take worker %s: %s", worker_id, exc)

    servicer = AggregatorServicer(run, WorkerTracker(track_quietly).track)
    server, port, health = start_server(lambda s: add_to_server(servicer, s), cfg, SERVICE)
    thread = run.start()
    wake = threading.Event()

    def stop_worker_sets(selector: str) -> None:
        from powertrip.services.aggregator.stop_workers import stop_workers

        try:
            names = stop_workers(selector)
        except (OSError, KeyError, ValueError) as exc:  # the run is done all the same
            logger.warning("could not stop the workers (%s): %s", selector, exc)
            return
        logger.info("run done: scaled %s to 0 (%s)", ", ".join(names) or "nothing", selector)

    def watch() -> None:  # a failed run ends the process; a finished one with EXIT_WHEN_DONE
        thread.join()
        state = run.status_snapshot().status.state
        if cfg.exit_when_done and state is RunState.DONE:
            if cfg.stop_workers:  # Kubernetes: the worker StatefulSets to 0, so none restarts
                stop_worker_sets(cfg.stop_workers)
            # DONE served for one lease first: every live worker heartbeats within it, so each
            # hears the run ended (worker/run_end.py) before this port closes
            wake.wait(cfg.lease_s)
        if cfg.exit_when_done or state is RunState.FAILED:
            wake.set()

    threading.Thread(target=watch, name="run-watch", daemon=True).start()

    def stop(deadline: float) -> None:
        """No new round; the open one gets half the time left, then is abandoned with what
        arrived (aggregated and checkpointed like a round cut at its deadline)."""
        run.stop()
        thread.join(max(0.0, (deadline - time.monotonic()) / 2))
        gate = run.executor.collector
        if thread.is_alive() and gate is not None:
            logger.warning("stopping: round %d abandoned with the updates that arrived", gate.round)
            gate.close()
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            logger.warning("stopping: the run's thread did not end within the grace period")

    def exit_code(signalled: bool) -> int:
        """0 when told to stop; otherwise the run's end: EXIT_RUN_FAILED, 0 when DONE."""
        if signalled:
            return 0
        state = run.status_snapshot().status.state
        if state is RunState.FAILED:
            return EXIT_RUN_FAILED
        return 0 if state is RunState.DONE else 1

    grpc_addr = f"{cfg.bind_host}:{port}"
    signalled = serve(
        "aggregator",
        server,
        health,
        [SERVICE],
        grpc_addr,
        metrics_port,
        on_stop=stop,
        grace_s=cfg.shutdown_grace_s,
        wake=wake,
        exit_code=exit_code,
    )
    code = exit_code(signalled)
    if code == EXIT_RUN_FAILED:
        status = run.status_snapshot().status
        logger.error("exit %d: the run failed: %s", EXIT_RUN_FAILED, status.message)
    exit_process(code)


if __name__ == "__main__":
    sys.exit(main())
