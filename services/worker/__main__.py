"""powertrip-worker: host sites, register with the aggregator, train rounds."""

from __future__ import annotations

import logging
import sys
import threading
import time

from powertrip.curtailment.config import CurtailmentConfig
from powertrip.experiment import ExperimentConfig
from powertrip.sites import site_id
from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc, worker_pb2_grpc
from services.common.command_line import parse_service_args
from services.common.config import ConfigError, load_config
from services.common.fault_points import armed_faults
from services.common.grpc_client import make_channel, retry_idempotent
from services.common.grpc_server import build_server, serve
from services.common.logging import configure
from services.common.metrics import start_metrics_server
from services.common.tensor_stream import DEFAULT_CHUNK_BYTES
from services.worker.config import WorkerConfig
from services.worker.runner import RoundRunner
from services.worker.servicer import WorkerServicer
from services.worker.sites_host import SitesHost
from services.worker.stream_host import StreamHost
from services.worker.uploader import GrpcUploader

logger = logging.getLogger("services.worker")
SERVICE = "powertrip.v1.WorkerService"


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
    import torch

    torch.set_num_threads(cfg.train_threads)
    metrics_port = start_metrics_server(cfg.metrics_port, cfg.bind_host)
    channel = make_channel(cfg.aggregator_addr, cfg)
    stub = aggregator_pb2_grpc.AggregatorServiceStub(channel)
    runner = RoundRunner(GrpcUploader(channel, cfg.worker_id, DEFAULT_CHUNK_BYTES))
    servicer = WorkerServicer(runner, cfg.site_indices)
    server, port, health = build_server(
        [lambda s: worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, s)],
        f"{cfg.bind_host}:{cfg.grpc_port}",
        cfg,
        [SERVICE],
    )
    server.start()
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

    try:
        reply = register(ready=False)  # the run configuration first; rounds wait for ready
        if reply.mode == "curtailment":
            curtail = CurtailmentConfig.model_validate_json(reply.curtail_config_json)
            runner.start(StreamHost(curtail, cfg.site_indices, device))
        else:
            run_cfg = ExperimentConfig.model_validate_json(reply.run_config_json)
            runner.start(SitesHost(run_cfg, reply.run_seed, cfg.site_indices, device))
        register(ready=True)
    except Exception as exc:
        logger.error("cannot join the run at %s: %s", cfg.aggregator_addr, exc)
        server.stop(grace=None)
        return 1
    logger.info("worker %s hosts %d sites at %s", cfg.worker_id, len(cfg.site_indices), address)
    stopping = threading.Event()

    def heartbeat() -> None:
        while not stopping.wait(cfg.heartbeat_s):
            try:
                register()
            except Exception as exc:  # keep beating: the aggregator may come back
                logger.warning("heartbeat to %s failed: %s", cfg.aggregator_addr, exc)

    threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()

    def stop(deadline: float) -> None:  # never abort training: let the thread end, then exit
        stopping.set()
        runner.stop()
        if not runner.join(deadline - time.monotonic()):
            logger.warning("stopping: training still running at the grace period's end")

    serve("worker", server, health, [SERVICE], address, metrics_port, on_stop=stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
