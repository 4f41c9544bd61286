"""Availability episodes and carbon traces on the wire (profiler -> aggregator), both ways, so
the aggregator rebuilds exactly the objects the profiler computed."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np

from powertrip.curtailment.availability import AvailabilityRule, Episode, SiteAvailability
from powertrip.traces.carbon import CarbonTrace
from powertrip.v1 import profiler_pb2


def availability_reply(
    sites: Sequence[SiteAvailability], rule: AvailabilityRule, trace: CarbonTrace
) -> profiler_pb2.GetAvailabilityResponse:
    return profiler_pb2.GetAvailabilityResponse(
        sites=[
            profiler_pb2.SiteAvailability(
                site_id=s.site,
                region=s.region,
                episodes=[
                    profiler_pb2.AvailabilityEpisode(
                        provisioned_seconds=e.provisioned_s,
                        ready_seconds=e.ready_s,
                        end_seconds=e.end_s,
                    )
                    for e in s.episodes
                ],
            )
            for s in sites
        ],
        threshold=rule.threshold,
        hold_seconds=rule.hold_s,
        provisioning_seconds=rule.provisioning_s,
        trace=profiler_pb2.CarbonTraceData(
            regions=list(trace.regions),
            time_seconds=trace.time_s.tolist(),
            intensity=trace.intensity.ravel().tolist(),
            step_seconds=trace.step_s,
            label=trace.label,
            source=trace.source,
            start_iso=trace.start.isoformat(),
        ),
    )


def from_availability_reply(
    reply: profiler_pb2.GetAvailabilityResponse,
) -> tuple[list[SiteAvailability], AvailabilityRule, CarbonTrace]:
    sites = [
        SiteAvailability(
            s.site_id,
            s.region,
            tuple(
                Episode(e.provisioned_seconds, e.ready_seconds, e.end_seconds) for e in s.episodes
            ),
        )
        for s in reply.sites
    ]
    rule = AvailabilityRule(reply.threshold, reply.hold_seconds, reply.provisioning_seconds)
    t = reply.trace
    time_s = np.asarray(t.time_seconds, dtype=np.float64)
    trace = CarbonTrace(
        tuple(t.regions),
        datetime.fromisoformat(t.start_iso),
        time_s,
        np.asarray(t.intensity, dtype=np.float64).reshape(len(t.regions), time_s.size),
        t.step_seconds,
        t.label,
        t.source,
    )
    return sites, rule, trace
