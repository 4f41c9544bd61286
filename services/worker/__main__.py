"""powertrip-worker: host sites, register with the aggregator, train rounds."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeGuard

import grpc

from powertrip.services.common.command_line import parse_service_args
from powertrip.services.common.config import ConfigError, load_config
from powertrip.services.common.fault_points import armed_faults
from powertrip.services.common.grpc_client import make_channel, retry_idempotent
from powertrip.services.common.grpc_server import exit_process, serve, start_server
from powertrip.services.common.identity import AGGREGATOR
from powertrip.services.common.logging import configure
from powertrip.services.common.metrics import start_metrics_server
from powertrip.services.common.tensor_stream import DEFAULT_CHUNK_BYTES
from powertrip.services.env_names import warn_unknown_names
from powertrip.services.worker.config import WorkerConfig
from powertrip.services.worker.run_mode import UnsupportedMode, host_for_reply, partition_host
from powertrip.services.worker.runner import RoundRunner
from powertrip.services.worker.servicer import WorkerServicer
from powertrip.services.worker.state_dir import SavedRun, WorkerStateDir
from powertrip.services.worker.uploader import GrpcUploader
from powertrip.sites.profiles import site_id
from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc, worker_pb2_grpc

logger = logging.getLogger("powertrip.services.worker")
SERVICE = "powertrip.v1.WorkerService"
#: registration refusals a worker waits out instead of exiting: a supervisor restarting it would
#: change nothing, while the operator may fix the site owners map or a squatter may go away
REFUSED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ALREADY_EXISTS)


class RefusalLog:
    """Logs each distinct refusal once (a refused worker retries every few seconds, for hours)."""

    def __init__(self, limit: int = 64) -> None:
        self.seen: set[str] = set()
        self.limit = limit

    def __call__(self, what: str, exc: grpc.RpcError, retry_s: float) -> None:
        message = f"{exc.code().name}: {exc.details()}"
        if message in self.seen:
            return
        if len(self.seen) >= self.limit:
            self.seen.clear()
        self.seen.add(message)
        logger.error(
            "%s refused by the aggregator (%s); retrying every %g s", what, message, retry_s
        )


def refused(exc: BaseException) -> TypeGuard[grpc.RpcError]:
    return isinstance(exc, grpc.RpcError) and exc.code() in REFUSED


def join(
    register: Callable[[bool], aggregator_pb2.RegisterWorkerResponse], ready: bool, retry_s: float
) -> aggregator_pb2.RegisterWorkerResponse:
    """Register, waiting out refusals (one line each) without exiting; other errors raise."""
    log = RefusalLog()
    while True:
        try:
            reply = register(ready)
        except grpc.RpcError as exc:
            if not refused(exc):
                raise
            log("registration", exc, retry_s)
            time.sleep(retry_s)
            continue
        if log.seen:
            logger.info("registration accepted after %d refusal message(s)", len(log.seen))
        return reply


def join_run(
    register: Callable[[bool], aggregator_pb2.RegisterWorkerResponse],
    runner: RoundRunner,
    cfg: WorkerConfig,
    device: str,
    state: WorkerStateDir | None,
) -> None:
    """Build the sites and register as ready. A worker restarted with a state directory
    rebuilds them from the saved run before it reaches the aggregator and registers as ready at
    once, so the sites never leave the selection; a fresh one fetches the run first
    (registering as not ready: rounds wait), and saves it. The hosts code their updates with
    the run's codec (its configuration names it)."""
    saved = state.saved_run() if state is not None else None
    if saved is not None and state is not None:
        runner.start(partition_host(saved, cfg, device, state))
        logger.info("rebuilt run %s's sites from %s; rejoining", saved.identity, state.directory)
        reply = join(register, True, cfg.heartbeat_s)
        if reply.mode != "curtailment" and saved == SavedRun(reply.run_config_json, reply.run_seed):
            return
        logger.warning(
            "%s holds another run than the aggregator's: starting fresh", state.directory
        )
        runner.start(None)  # Busy until rebuilt
        state.forget()
    reply = join(register, False, cfg.heartbeat_s)  # the run config first; rounds wait
    runner.start(host_for_reply(reply, cfg, device, state))
    join(register, True, cfg.heartbeat_s)


def main() -> int:
    parse_service_args("powertrip-worker", WorkerConfig, __doc__)
    try:
        cfg = load_config(WorkerConfig)
        device = cfg.usable_device()  # before registering: no GPU, no join
        armed_faults()  # a test hook's typo fails here, not silently
    except ConfigError as exc:
        print(f"powertrip-worker: {exc}", file=sys.stderr)
        return 2
    configure("worker", cfg.log_level)
    warn_unknown_names("worker")
    import torch

    torch.set_num_threads(cfg.train_threads)
    metrics_port = start_metrics_server(cfg.metrics_port, cfg.metrics_addr)
    channel = make_channel(cfg.aggregator_addr, cfg, AGGREGATOR)
    stub = aggregator_pb2_grpc.AggregatorServiceStub(channel)
    bf16 = cfg.upload_dtype == "bfloat16"
    uploader = GrpcUploader(channel, cfg.worker_id, DEFAULT_CHUNK_BYTES, bf16)
    runner = RoundRunner(uploader)
    servicer = WorkerServicer(runner, cfg.site_indices)
    server, port, health = start_server(
        lambda s: worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, s), cfg, SERVICE
    )
    address = f"{cfg.advertise_host}:{port}"

    @retry_idempotent(max_seconds=cfg.register_timeout_s, max_attempts=1000)
    def register(ready: bool = True) -> aggregator_pb2.RegisterWorkerResponse:
        return stub.RegisterWorker(
            aggregator_pb2.RegisterWorkerRequest(
                worker_id=cfg.worker_id,
                address=address,
                site_ids=[site_id(s) for s in cfg.site_indices],
                ready=ready,
            ),
            timeout=cfg.rpc_timeout_s,
        )

    # one subdirectory per worker id: workers sharing a volume never read each other's states
    state_root = cfg.worker_state_dir
    state = WorkerStateDir(state_root / cfg.worker_id) if state_root else None
    try:  # refused: NOT_SERVING (serve() not reached) and retrying, so no restart loop
        join_run(register, runner, cfg, device, state)
    except UnsupportedMode as exc:  # never a run it cannot train (a state file it cannot
        logger.error("refusing to start: %s", exc)  # trust is set aside, not a refusal)
        server.stop(grace=None)
        return 2
    except Exception as exc:
        logger.error("cannot join the run at %s: %s", cfg.aggregator_addr, exc)
        server.stop(grace=None)
        return 1
    logger.info("worker %s hosts %d sites at %s", cfg.worker_id, len(cfg.site_indices), address)
    stopping = threading.Event()

    def heartbeat() -> None:
        refusals = RefusalLog()
        while not stopping.wait(cfg.heartbeat_s):
            try:
                register()
                refusals.seen.clear()
            except Exception as exc:  # keep beating: the aggregator may come back
                if refused(exc):  # revoked, or its sites reassigned: once, not every beat
                    refusals("heartbeat", exc, cfg.heartbeat_s)
                else:
                    logger.warning("heartbeat to %s failed: %s", cfg.aggregator_addr, exc)

    threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()

    def stop(deadline: float) -> None:  # never abort training: let the thread end, then exit
        stopping.set()
        runner.stop()
        if not runner.join(deadline - time.monotonic()):
            logger.warning("stopping: training still running at the grace period's end")
        runner.start(None)  # closes the host: a distributed site's rank processes end too

    serve("worker", server, health, [SERVICE], address, metrics_port, on_stop=stop)
    exit_process(0)


if __name__ == "__main__":
    sys.exit(main())
