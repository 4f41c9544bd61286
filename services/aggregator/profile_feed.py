"""The aggregator's client of the profiler, for both run modes.

PowerTrip mode asks for the sites' profiles every round (power and links, the inputs of Eq. 8's
ranking); curtailment mode asks once for the sites' availability and the carbon trace. Either
answer must describe this run's sites, or the run would select sites that no worker hosts.

A slow or dead profiler must not stall the run (docs/liveness.md). Each round makes at most
one call, with the short POWERTRIP_RPC_TIMEOUT_S deadline and no retry; when it fails a circuit
breaker opens: for POWERTRIP_PROFILER_RETRY_S the rounds use the cached profile at once, without
calling, so a frozen profiler costs the run one timeout per retry period, not one per round.
``powertrip_profiler_degraded`` is 1 meanwhile. The cache is trusted for
POWERTRIP_PROFILER_STALE_S: beyond that, new rounds are held (retrying with backoff) until the
profiler answers, because selection ranks sites by their power now, and a picture that old no
longer says which sites can train fast; an operator who prefers to train on old data raises the
limit. With no profile at all (the profiler is down when the aggregator starts) the first round
is held the same way. A hold never crashes the run and ends at once on stop (SIGTERM).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

import grpc
import numpy as np

from powertrip.curtailment.availability import SiteAvailability
from powertrip.rounds.loop import TimeModel
from powertrip.services.aggregator import metrics
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.common.grpc_client import make_channel, retry_idempotent
from powertrip.services.common.identity import PROFILER
from powertrip.services.common.wire import from_availability_reply
from powertrip.sites.profiles import SiteProfile, site_id, site_index
from powertrip.sites.timing import comm_time_s
from powertrip.traces.carbon import CarbonTrace
from powertrip.v1 import profiler_pb2, profiler_pb2_grpc

logger = logging.getLogger(__name__)
FIRST_BACKOFF_S = 0.5  # a hold's first wait; doubles up to POWERTRIP_PROFILER_RETRY_S


class ProfilerWaitStopped(RuntimeError):
    """The run was stopped while a round waited for the profiler."""


class ProfileFeed:
    def __init__(
        self,
        cfg: AggregatorConfig,
        num_sites: int,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.num_sites = num_sites
        channel = make_channel(cfg.profiler_addr, cfg, PROFILER)
        self._stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
        self._stop = stop or threading.Event()
        self._clock = clock
        self._last: SiteProfile | None = None
        self._answered_at: float | None = None  # when the profiler last answered
        self._retry_at = -math.inf  # circuit breaker: no call before this
        self.degraded = False
        # site -> (RTT seconds, bytes per second) as the profiler last measured it (uploads'
        # flow control sizes each site's window from it: services/aggregator/upload_flow.py)
        self.links: dict[int, tuple[float, float]] = {}
        metrics.PROFILER_DEGRADED.set(0)
        metrics.PROFILE_AGE.set_function(self.age_s)

    def age_s(self) -> float:
        """Seconds since the profiler last answered; NaN before its first answer."""
        return math.nan if self._answered_at is None else self._clock() - self._answered_at

    @property
    def stale(self) -> bool:
        return self._answered_at is None or self.age_s() > self.cfg.profiler_stale_s

    def site_profiles(self, t_s: float, time_model: TimeModel) -> SiteProfile:
        """The sites at ``t_s``: a fresh answer, or the cached one while the breaker is open
        (zero wait); held until the profiler answers when there is none or it is stale."""
        if self._last is not None:
            if self._clock() >= self._retry_at:
                self._try(t_s, time_model)
            if not self.stale:
                return self._last
            logger.warning(
                "the last profile is %.0f s old (POWERTRIP_PROFILER_STALE_S=%g): holding new "
                "rounds until the profiler answers",
                self.age_s(),
                self.cfg.profiler_stale_s,
            )
        return self._hold(t_s, time_model)

    def _hold(self, t_s: float, time_model: TimeModel) -> SiteProfile:
        """Ask until the profiler answers, backing off up to POWERTRIP_PROFILER_RETRY_S; one
        log line per group of attempts (1, 2, 4, 8, ...), not one per attempt."""
        attempt, wait_s = 0, FIRST_BACKOFF_S
        while not self._try(t_s, time_model):
            attempt += 1
            if attempt & (attempt - 1) == 0:
                logger.warning(
                    "waiting for the profiler at %s: %d attempts so far, next in %.1f s",
                    self.cfg.profiler_addr,
                    attempt,
                    wait_s,
                )
            if self._stop.wait(wait_s):
                raise ProfilerWaitStopped("stopped while waiting for the profiler")
            wait_s = min(2 * wait_s, self.cfg.profiler_retry_s)
        assert self._last is not None
        return self._last

    def _try(self, t_s: float, time_model: TimeModel) -> bool:
        """One call with the short deadline; on failure open the breaker. True if answered."""
        try:
            reply = self._stub.GetSiteProfiles(
                profiler_pb2.GetSiteProfilesRequest(time_seconds=t_s),
                timeout=self.cfg.rpc_timeout_s,
            )
        except grpc.RpcError as exc:
            self._retry_at = self._clock() + self.cfg.profiler_retry_s
            if not self.degraded:
                logger.warning(
                    "profiler unavailable (%s); %s, next call in %g s",
                    exc.code().name,
                    "using the last profile" if self._last is not None else "no profile yet",
                    self.cfg.profiler_retry_s,
                )
            self._set_degraded(True)
            return False
        self._last = self.to_profile(reply, time_model)  # a wrong site count fails the run
        self._answered_at = self._clock()
        self._retry_at = -math.inf
        if self.degraded:
            logger.info("profiler answers again")
        self._set_degraded(False)
        return True

    def _set_degraded(self, degraded: bool) -> None:
        self.degraded = degraded
        metrics.PROFILER_DEGRADED.set(int(degraded))

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
        self.links.update(
            (site_index(p.site_id), (p.rtt_seconds, p.bandwidth_bytes_per_second))
            for p in rows
            if p.measured_at_seconds > 0 and p.rtt_seconds > 0 and p.bandwidth_bytes_per_second > 0
        )
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
                f"{self.num_sites}: set the same POWERTRIP_REGIONS and "
                "POWERTRIP_SITES_PER_REGION for both"
            )
        return sites, rule.threshold, trace
