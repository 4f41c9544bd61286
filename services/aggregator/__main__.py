"""python -m services.aggregator: register workers, run rounds, serve status and metrics."""

from __future__ import annotations

import logging
import signal
import sys

from powertrip.v1 import aggregator_pb2_grpc, profiler_pb2, profiler_pb2_grpc
from services.aggregator.config import AggregatorConfig
from services.aggregator.run import AggregatorRun, RunState
from services.aggregator.servicer import AggregatorServicer
from services.common.config import ConfigError, load_config
from services.common.grpc_client import make_channel, retry_idempotent
from services.common.grpc_server import build_server, set_serving
from services.common.logging import configure
from services.common.metrics import start_metrics_server

logger = logging.getLogger("services.aggregator")
SERVICE = "powertrip.v1.AggregatorService"


def main() -> int:
    try:
        cfg = load_config(AggregatorConfig)
        cfg.experiment()
    except (ConfigError, ValueError) as exc:
        print(f"powertrip-aggregator: {exc}", file=sys.stderr)
        return 2
    configure("aggregator", cfg.log_level)
    import torch

    torch.set_num_threads(1)
    metrics_port = start_metrics_server(cfg.metrics_port, cfg.bind_host)
    run = AggregatorRun(cfg)
    profiler = profiler_pb2_grpc.ProfilerServiceStub(make_channel(cfg.profiler_addr, cfg))

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

    servicer = AggregatorServicer(run, track_quietly)
    server, port, health = build_server(
        [lambda s: aggregator_pb2_grpc.add_AggregatorServiceServicer_to_server(servicer, s)],
        f"{cfg.bind_host}:{cfg.grpc_port}",
        cfg,
        [SERVICE],
    )
    server.start()
    set_serving(health, [SERVICE], True)
    print(
        f"READY service=aggregator grpc={cfg.bind_host}:{port} metrics={metrics_port}", flush=True
    )
    thread = run.start()

    def shutdown(signum: int, _frame: object) -> None:
        set_serving(health, [SERVICE], False)
        run.stop()
        server.stop(grace=5)

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    if cfg.exit_when_done:
        thread.join()
        server.stop(grace=2)
        return 0 if run.status.state is RunState.DONE else 1
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
