"""powertrip-worker: host sites, register with the aggregator, train rounds."""

from __future__ import annotations

import logging
import sys
import threading
import time

from powertrip.services.common.command_line import parse_service_args
from powertrip.services.common.config import ConfigError, load_config
from powertrip.services.worker.config import WorkerConfig

logger = logging.getLogger("powertrip.services.worker")
SERVICE = "powertrip.v1.WorkerService"


def main() -> int:
    parse_service_args("powertrip-worker", WorkerConfig, __doc__)
    # the service itself (gRPC, torch, the training code): only once --help is not asked for
    from powertrip.services.common.fault_points import armed_faults
    from powertrip.services.common.grpc_client import make_channel, retry_idempotent
    from powertrip.services.common.grpc_server import exit_process, serve, start_server
    from powertrip.services.common.identity import AGGREGATOR
    from powertrip.services.common.logging import configure
    from powertrip.services.common.metrics import start_metrics_server
    from powertrip.services.common.tensor_stream import DEFAULT_CHUNK_BYTES
    from powertrip.services.env_names import warn_unknown_names
    from powertrip.services.worker.joining import RefusalLog, join_run, refused
    from powertrip.services.worker.run_end import run_is_done
    from powertrip.services.worker.run_mode import UnsupportedMode
    from powertrip.services.worker.runner import RoundRunner
    from powertrip.services.worker.servicer import WorkerServicer
    from powertrip.services.worker.state_dir import WorkerStateDir
    from powertrip.services.worker.uploader import GrpcUploader
    from powertrip.sites.profiles import site_id
    from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc, worker_pb2_grpc

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
    run_done = threading.Event()  # POWERTRIP_EXIT_WHEN_DONE: the run is over, so is this worker

    def heartbeat() -> None:
        refusals = RefusalLog()
        while not stopping.wait(cfg.heartbeat_s):
            try:
                register()
                refusals.seen.clear()
                if cfg.exit_when_done and run_is_done(stub, cfg.rpc_timeout_s):
                    logger.info("the run is done: worker %s exits", cfg.worker_id)
                    run_done.set()
                    return
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

    serve("worker", server, health, [SERVICE], address, metrics_port, on_stop=stop, wake=run_done)
    exit_process(0)


if __name__ == "__main__":
    sys.exit(main())
