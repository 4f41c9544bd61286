"""powertrip-profiler: serve site profiles and probe worker links."""

from __future__ import annotations

import logging
import sys
import threading

from powertrip.services.common.command_line import parse_service_args
from powertrip.services.common.config import ConfigError, load_config
from powertrip.services.profiler.config import ProfilerConfig

SERVICE = "powertrip.v1.ProfilerService"
logger = logging.getLogger("powertrip.services.profiler")


def main() -> int:
    parse_service_args("powertrip-profiler", ProfilerConfig, __doc__)
    # the service itself (gRPC, numpy, the traces): only once --help is not asked for
    from powertrip.services.common.grpc_server import exit_process, serve, start_server
    from powertrip.services.common.logging import configure
    from powertrip.services.common.metrics import start_metrics_server
    from powertrip.services.env_names import warn_unknown_names
    from powertrip.services.netem.latency import log_latency_path
    from powertrip.services.profiler.catalogue import SiteCatalogue
    from powertrip.services.profiler.feed import CarbonFeed
    from powertrip.services.profiler.servicer import LinkProber, ProfilerServicer
    from powertrip.v1 import profiler_pb2_grpc

    try:
        cfg = load_config(ProfilerConfig)
    except ConfigError as exc:
        print(f"powertrip-profiler: {exc}", file=sys.stderr)
        return 2
    configure("profiler", cfg.log_level)
    warn_unknown_names("profiler")
    metrics_port = start_metrics_server(cfg.metrics_port, cfg.metrics_addr)
    try:
        catalogue = SiteCatalogue(cfg)
    except (OSError, ValueError) as exc:  # an unreadable or invalid power trace
        print(f"powertrip-profiler: power model {cfg.power_model}: {exc}", file=sys.stderr)
        return 2
    logger.info(
        "power: %s over %d sites (site seed %d); probes: %d pings + %d bytes every %g s, "
        "at most %d probe bytes per hour",
        catalogue.power_label,
        cfg.num_sites,
        cfg.site_seed,
        cfg.ping_count,
        cfg.probe_bytes,
        cfg.probe_interval_s,
        cfg.probe_budget_bytes_per_hour,
    )
    try:
        carbon = CarbonFeed.build(cfg.curtail_config())
    except (OSError, ValueError) as exc:  # an unreadable carbon trace or unknown regions
        print(f"powertrip-profiler: carbon trace: {exc}", file=sys.stderr)
        return 2
    logger.info(
        "carbon: %s, sites %s",
        carbon.trace.label,
        ", ".join(f"{a.site}={a.region}" for a in carbon.availability),
    )
    log_latency_path(logger)
    prober = LinkProber(cfg)
    servicer = ProfilerServicer(catalogue, prober, carbon)
    server, port, health = start_server(
        lambda s: profiler_pb2_grpc.add_ProfilerServiceServicer_to_server(servicer, s), cfg, SERVICE
    )
    threading.Thread(target=prober.run_periodically, name="prober", daemon=True).start()
    serve(
        "profiler",
        server,
        health,
        [SERVICE],
        f"{cfg.bind_host}:{port}",
        metrics_port,
        on_stop=lambda _deadline: prober.stop(),
    )
    exit_process(0)


if __name__ == "__main__":
    sys.exit(main())
