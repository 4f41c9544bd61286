"""A small real AggregatorService in the test process: 4 sites, 1,000 samples, no checkpoints,
served on a real socket (port 0). The servicer, identity and weight tests share it."""

from __future__ import annotations

import grpc

from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.run import AggregatorRun
from powertrip.services.aggregator.service_handlers import add_to_server
from powertrip.services.aggregator.servicer import AggregatorServicer
from powertrip.services.common.config import load_config
from powertrip.services.common.grpc_server import build_server, set_serving

SERVICE = "powertrip.v1.AggregatorService"
SMALL_RUN = {
    "POWERTRIP_PROFILER_ADDR": "127.0.0.1:1",  # nothing there: status and rounds need no profiler
    "POWERTRIP_NUM_SITES": "4",
    "POWERTRIP_NUM_SAMPLES": "1000",
    "POWERTRIP_CHECKPOINT_DIR": "",
}


def small_run(**env: str) -> AggregatorRun:
    """The run, configured by ``SMALL_RUN`` plus ``env`` (TLS paths or POWERTRIP_INSECURE)."""
    return AggregatorRun(load_config(AggregatorConfig, {**SMALL_RUN, **env}))


def serve(run: AggregatorRun) -> tuple[grpc.Server, int]:
    """``run``'s AggregatorService started on 127.0.0.1 and SERVING; (server, port)."""
    servicer = AggregatorServicer(run)
    server, port, health = build_server(
        [lambda s: add_to_server(servicer, s)],
        "127.0.0.1:0",
        run.cfg,
        [SERVICE],
    )
    server.start()
    set_serving(health, [SERVICE], True)
    return server, port
