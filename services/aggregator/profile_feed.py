"""The aggregator's client of the profiler, for both run modes.

PowerTrip mode asks for the sites' profiles every round (power and links, the inputs of Eq. 8's
ranking) and goes on with the last good answer when the profiler is slow or down; curtailment
mode asks once for the sites' availability and the carbon trace. Either answer must describe
this run's sites, or the run would select sites that no worker hosts.
"""

from __future__ import annotations

import logging

import grpc
import numpy as np

from powertrip.curtailment.availability import SiteAvailability
from powertrip.rounds import TimeModel
from powertrip.sites import SiteProfile, site_id, site_index
from powertrip.timing import comm_time_s
from powertrip.traces.carbon import CarbonTrace
from powertrip.v1 import profiler_pb2, profiler_pb2_grpc
from services.aggregator.config import AggregatorConfig
from services.common.grpc_client import make_channel, retry_idempotent
from services.common.wire import from_availability_reply

logger = logging.getLogger(__name__)


class ProfileFeed:
    def __init__(self, cfg: AggregatorConfig, num_sites: int) -> None:
        self.cfg = cfg
        self.num_sites = num_sites
        self._stub = profiler_pb2_grpc.ProfilerServiceStub(make_channel(cfg.profiler_addr, cfg))
        self._last: SiteProfile | None = None

    def site_profiles(self, t_s: float, time_model: TimeModel) -> SiteProfile:
        """The sites at ``t_s``; the last good answer when the profiler does not reply."""

        @retry_idempotent(max_seconds=self.cfg.rpc_timeout_s, max_attempts=3)
        def fetch() -> profiler_pb2.GetSiteProfilesResponse:
            return self._stub.GetSiteProfiles(
                profiler_pb2.GetSiteProfilesRequest(time_seconds=t_s),
                timeout=self.cfg.rpc_timeout_s,
            )

        try:
            reply = fetch()
        except grpc.RpcError as exc:
            if self._last is None:
                raise
            logger.warning("profiler unavailable (%s); using the last profile", exc.code())
            return self._last
        self._last = self.to_profile(reply, time_model)
        return self._last

    def to_profile(
        self, reply: profiler_pb2.GetSiteProfilesResponse, time_model: TimeModel
    ) -> SiteProfile:
        """On the wall clock a probed site's measured link replaces its modelled one (Eq. 3);
        on the emulated clock the links are the site model's, as in the emulator."""
        n = self.num_sites
        rows = sorted(reply.sites, key=lambda p: site_index(p.site_id))
        if [site_index(p.site_id) for p in rows] != list(range(n)):
            raise RuntimeError(
                f"the profiler serves {len(rows)} sites but this run has {n}: "
                "set the same POWERTRIP_NUM_SITES for both"
            )
        measured = self.cfg.clock == "wall"
        latency = np.array(
            [
                p.rtt_seconds / 2
                if measured and p.measured_at_seconds > 0
                else p.modelled_latency_seconds
                for p in rows
            ]
        )
        bandwidth_bits = 8 * np.array(
            [
                p.bandwidth_bytes_per_second
                if measured and p.measured_at_seconds > 0
                else p.modelled_bandwidth_bytes_per_second
                for p in rows
            ]
        )
        tm = time_model
        return SiteProfile(
            power=np.array([p.power_fraction for p in rows]),
            comm_s=comm_time_s(latency, bandwidth_bits, tm.update_bytes, round_trip=tm.round_trip),
            distance_mi=np.array([p.distance_miles for p in rows]),
        )

    def availability(self) -> tuple[list[SiteAvailability], float, CarbonTrace]:
        """Curtailment mode: each site's availability, the curtailment threshold and the trace."""

        @retry_idempotent(max_seconds=60, max_attempts=30)
        def fetch() -> profiler_pb2.GetAvailabilityResponse:
            return self._stub.GetAvailability(
                profiler_pb2.GetAvailabilityRequest(), timeout=self.cfg.rpc_timeout_s
            )

        sites, rule, trace = from_availability_reply(fetch())
        ids = [s.site for s in sites]
        if ids != [site_id(i) for i in range(self.num_sites)]:
            raise RuntimeError(
                f"the profiler has {len(ids)} curtailment sites but this run has "
                f"{self.num_sites}: set the same POWERTRIP_SITE_REGIONS and "
                "POWERTRIP_SITES_PER_REGION for both"
            )
        return sites, rule.threshold, trace
