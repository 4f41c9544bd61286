"""ProfilerService: tracks workers, probes their links, serves site profiles."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import grpc

from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.errors import BadRequest, NotFound, translate_errors
from powertrip.services.common.grpc_client import make_channel
from powertrip.services.common.identity import (
    AGGREGATOR,
    OPERATOR,
    require_id,
    require_role,
    require_site_ids,
)
from powertrip.services.common.wire import availability_reply
from powertrip.services.profiler import metrics
from powertrip.services.profiler.catalogue import SiteCatalogue
from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.profiler.feed import CarbonFeed
from powertrip.services.profiler.links import LinkEstimate
from powertrip.services.profiler.probe_budget import ProbeBudget
from powertrip.services.profiler.probes import measure_bandwidth, measure_rtt
from powertrip.sites.profiles import site_id
from powertrip.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc, worker_pb2_grpc

logger = logging.getLogger(__name__)
SERVICE = "ProfilerService"
#: who may call every method; tracked workers may also read (GetSiteProfiles, GetAvailability)
CONTROL = (AGGREGATOR, OPERATOR)


@dataclass
class TrackedWorker:
    address: str
    sites: list[int]
    stub: worker_pb2_grpc.WorkerServiceStub
    channel: grpc.Channel
    link: LinkEstimate


class LinkProber:
    """Owns the tracked workers and their link estimates; probes on demand or periodically.

    Every probe measures the RTT (median of ``ping_count`` pings); the bulk bandwidth stream of
    ``probe_bytes`` runs only while it fits in the hourly probe budget, otherwise the previous
    bandwidth estimate stands and the probe counts as ``over_budget``.
    """

    def __init__(
        self,
        cfg: ProfilerConfig,
        channel_cfg: ServiceConfig | None = None,
        budget: ProbeBudget | None = None,
    ) -> None:
        self.cfg = cfg
        self._channel_cfg = channel_cfg or cfg
        self._workers: dict[str, TrackedWorker] = {}
        self._lock = threading.Lock()
        self._probe_lock = threading.Lock()  # one probe at a time: probes share the links
        self._started = time.monotonic()
        self._stop = threading.Event()
        self.budget = budget or ProbeBudget(cfg.probe_budget_bytes_per_hour)

    def track(self, worker_id: str, address: str, sites: list[int]) -> None:
        with self._lock:
            old = self._workers.pop(worker_id, None)
            if old is not None:
                old.channel.close()
            channel = make_channel(address, self._channel_cfg, worker_id)
            self._workers[worker_id] = TrackedWorker(
                address,
                sites,
                worker_pb2_grpc.WorkerServiceStub(channel),
                channel,
                LinkEstimate(self.cfg.smoothing),
            )
            metrics.TRACKED_WORKERS.set(len(self._workers))

    def is_tracked(self, worker_id: str) -> bool:
        with self._lock:
            return worker_id in self._workers

    def links_by_site(self) -> dict[int, LinkEstimate]:
        with self._lock:
            return {s: w.link for w in self._workers.values() for s in w.sites if w.link.probes}

    def link(self, worker_id: str) -> LinkEstimate:
        with self._lock:
            if worker_id not in self._workers:
                raise NotFound(f"worker {worker_id!r} is not tracked")
            return self._workers[worker_id].link

    def measure(self, worker_ids: list[str] | None = None) -> None:
        with self._lock:
            targets = {k: w for k, w in self._workers.items() if not worker_ids or k in worker_ids}
        missing = sorted(set(worker_ids or ()) - targets.keys())
        if missing:
            raise NotFound(f"workers {missing} are not tracked")
        with self._probe_lock:
            for worker_id, w in targets.items():
                self._probe(worker_id, w)

    def _probe(self, worker_id: str, w: TrackedWorker) -> None:
        """The RTT, then (budget allowing) the bandwidth. A failed or meaningless bulk stream
        costs only the bandwidth: the RTT just measured is kept, the bandwidth estimate stays
        as it was."""
        cfg = self.cfg
        try:
            rtt, moved = measure_rtt(w.stub, cfg.ping_count, cfg.rpc_timeout_s)
        except grpc.RpcError as exc:
            metrics.PROBES.labels("failed").inc()
            logger.warning("probe of %s at %s failed: %s", worker_id, w.address, exc.code())
            return
        bandwidth, outcome = None, "over_budget"
        if self.budget.try_spend(cfg.probe_bytes):
            try:
                bandwidth, received = measure_bandwidth(
                    w.stub, cfg.probe_bytes, rtt, cfg.probe_timeout_s
                )
                moved += received
                outcome = "ok" if bandwidth is not None else "bandwidth_unusable"
            except grpc.RpcError as exc:
                outcome = "bandwidth_failed"
                logger.warning(
                    "bandwidth probe of %s at %s failed: %s; keeping its RTT",
                    worker_id,
                    w.address,
                    exc.code(),
                )
        else:
            logger.warning(
                "probe budget: %d of %d bytes used in the last hour; %s keeps its bandwidth "
                "estimate and gets pings only",
                self.budget.used(),
                self.budget.limit,
                worker_id,
            )
        w.link.update(rtt, bandwidth, time.monotonic() - self._started)
        metrics.PROBES.labels(outcome).inc()
        metrics.PROBE_BYTES.inc(moved)
        logger.info(
            "probe %s: rtt %.2f ms, bandwidth %s (smoothed: %.2f ms, %.2f Mbit/s)",
            worker_id,
            rtt * 1e3,
            "skipped" if bandwidth is None else f"{bandwidth * 8e-6:.2f} Mbit/s",
            w.link.rtt_s * 1e3,
            w.link.bandwidth_bytes_per_s * 8e-6,
        )
        for s in w.sites:
            metrics.SITE_RTT.labels(site_id(s)).set(w.link.rtt_s)
            metrics.SITE_BANDWIDTH.labels(site_id(s)).set(w.link.bandwidth_bytes_per_s)

    def run_periodically(self) -> None:
        while not self._stop.wait(self.cfg.probe_interval_s):
            try:
                self.measure()
            except Exception:  # the periodic prober must outlive one bad round of probes
                logger.exception("periodic link probes failed")

    def stop(self) -> None:
        self._stop.set()


class ProfilerServicer(profiler_pb2_grpc.ProfilerServiceServicer):
    """Over TLS: TrackWorker and MeasureLinks (which sends probes) only from the aggregator or
    the operator; the read-only GetSiteProfiles and GetAvailability also from a tracked worker.
    A refusal happens before any probe is sent."""

    def __init__(
        self, catalogue: SiteCatalogue, prober: LinkProber, carbon: CarbonFeed | None = None
    ) -> None:
        self.catalogue = catalogue
        self.prober = prober
        self.carbon = carbon

    def _profiles(self, t_s: float) -> list[common_pb2.SiteProfile]:
        rows = self.catalogue.rows(t_s, self.prober.links_by_site())
        out = []
        for r in rows:
            metrics.SITE_POWER.labels(site_id(r.index)).set(r.power)
            out.append(
                common_pb2.SiteProfile(
                    site_id=site_id(r.index),
                    distance_miles=r.distance_mi,
                    power_fraction=r.power,
                    modelled_latency_seconds=r.modelled_latency_s,
                    modelled_bandwidth_bytes_per_second=r.modelled_bandwidth_bytes_per_s,
                    rtt_seconds=r.rtt_s,
                    bandwidth_bytes_per_second=r.bandwidth_bytes_per_s,
                    measured_at_seconds=r.measured_at_s,
                    power_source=self.catalogue.power_label,
                    region=self.carbon.region_of(r.index) if self.carbon else "",
                    carbon_intensity=self.carbon.intensity_of(r.index, t_s) if self.carbon else 0,
                )
            )
        return out

    @translate_errors
    def TrackWorker(  # noqa: N802 - gRPC method name
        self, request: profiler_pb2.TrackWorkerRequest, context: grpc.ServicerContext
    ) -> profiler_pb2.TrackWorkerResponse:
        require_role(context, SERVICE, "TrackWorker", CONTROL)
        if not request.worker_id or not request.address:
            raise BadRequest("TrackWorker needs worker_id and address")
        require_id(SERVICE, "TrackWorker", request.worker_id)
        sites = require_site_ids(SERVICE, "TrackWorker", request.site_ids)
        n = self.catalogue.sites.size
        unknown = [site_id(s) for s in sites if s >= n]
        if unknown:
            raise NotFound(f"sites {unknown} are not in this profiler's {n}-site model")
        self.prober.track(request.worker_id, request.address, sites)
        threading.Thread(
            target=self.prober.measure, args=([request.worker_id],), daemon=True
        ).start()
        return profiler_pb2.TrackWorkerResponse()

    @translate_errors
    def GetSiteProfiles(  # noqa: N802
        self, request: profiler_pb2.GetSiteProfilesRequest, context: grpc.ServicerContext
    ) -> profiler_pb2.GetSiteProfilesResponse:
        require_role(context, SERVICE, "GetSiteProfiles", CONTROL, self.prober.is_tracked)
        if request.time_seconds < 0:
            raise BadRequest(f"time_seconds must be >= 0, got {request.time_seconds}")
        return profiler_pb2.GetSiteProfilesResponse(sites=self._profiles(request.time_seconds))

    @translate_errors
    def MeasureLinks(  # noqa: N802
        self, request: profiler_pb2.MeasureLinksRequest, context: grpc.ServicerContext
    ) -> profiler_pb2.MeasureLinksResponse:
        require_role(context, SERVICE, "MeasureLinks", CONTROL)
        if request.time_seconds < 0:
            raise BadRequest(f"time_seconds must be >= 0, got {request.time_seconds}")
        self.prober.measure(list(request.worker_ids))
        return profiler_pb2.MeasureLinksResponse(sites=self._profiles(request.time_seconds))

    @translate_errors
    def GetAvailability(  # noqa: N802
        self, request: profiler_pb2.GetAvailabilityRequest, context: grpc.ServicerContext
    ) -> profiler_pb2.GetAvailabilityResponse:
        require_role(context, SERVICE, "GetAvailability", CONTROL, self.prober.is_tracked)
        if self.carbon is None:
            raise NotFound("this profiler has no carbon trace (curtailment mode is off)")
        c = self.carbon
        return availability_reply(c.availability, c.rule, c.trace)
