"""The aggregator's profiler client under a slow, frozen or absent profiler (docs/liveness.md):
one short call per round, a circuit breaker that serves the cached profile at once while open,
rounds held (never crashed) while there is no trustworthy profile, and a stop that ends a hold.

A real gRPC server on a real socket plays the profiler, switchable between answering, hanging
(a frozen process) and refusing."""

from __future__ import annotations

import socket
import threading
import time
from concurrent import futures

import grpc
import pytest
from prometheus_client import REGISTRY

from powertrip.rounds.loop import TimeModel
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.profile_feed import ProfileFeed, ProfilerWaitStopped
from powertrip.services.common.config import load_config
from powertrip.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc

TM = TimeModel(1.0, 1000.0)
TIMEOUT_S = 0.3  # POWERTRIP_RPC_TIMEOUT_S here
RETRY_S = 5.0


class Profiler(profiler_pb2_grpc.ProfilerServiceServicer):
    def __init__(self) -> None:
        self.mode = "ok"  # "ok", "hang" (a frozen process) or "refuse"
        self.power = 0.5
        self.calls = 0
        self.thaw = threading.Event()

    def GetSiteProfiles(self, request, context):  # noqa: N802 - gRPC method name
        self.calls += 1
        if self.mode == "hang":
            self.thaw.wait(5)
        if self.mode == "refuse":
            context.abort(grpc.StatusCode.UNAVAILABLE, "refused for the test")
        sites = [
            common_pb2.SiteProfile(
                site_id=f"site-{i:03d}",
                power_fraction=self.power,
                modelled_latency_seconds=0.01,
                modelled_bandwidth_bytes_per_second=1e9,
            )
            for i in range(2)
        ]
        return profiler_pb2.GetSiteProfilesResponse(sites=sites)


def serve(servicer: Profiler, port: int = 0) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    profiler_pb2_grpc.add_ProfilerServiceServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, bound


class Clock:
    """The breaker's and the staleness limit's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def feed_for(port: int, clock=time.monotonic, stop=None, stale_s: float = 600.0) -> ProfileFeed:
    cfg = load_config(
        AggregatorConfig,
        {
            "POWERTRIP_PROFILER_ADDR": f"127.0.0.1:{port}",
            "POWERTRIP_INSECURE": "1",
            "POWERTRIP_RPC_TIMEOUT_S": str(TIMEOUT_S),
            "POWERTRIP_PROFILER_RETRY_S": str(RETRY_S),
            "POWERTRIP_PROFILER_STALE_S": str(stale_s),
        },
    )
    return ProfileFeed(cfg, 2, stop=stop, clock=clock)


def gauge(name: str) -> float | None:
    return REGISTRY.get_sample_value(name)


@pytest.fixture
def profiler():
    servicer = Profiler()
    server, port = serve(servicer)
    yield servicer, port
    servicer.thaw.set()
    server.stop(None)


def timed(fn):
    started = time.monotonic()
    out = fn()
    return out, time.monotonic() - started


@pytest.mark.reliability("R21")
def test_a_frozen_profiler_costs_one_timeout_then_rounds_use_the_cache_at_once(profiler):
    servicer, port = profiler
    clock = Clock()
    feed = feed_for(port, clock)
    fresh = feed.site_profiles(0.0, TM)
    assert gauge("powertrip_profiler_degraded") == 0
    servicer.mode = "hang"
    cached, took = timed(lambda: feed.site_profiles(1.0, TM))
    assert cached is fresh and TIMEOUT_S <= took < TIMEOUT_S + 0.5  # the one timeout
    assert gauge("powertrip_profiler_degraded") == 1
    calls = servicer.calls
    for t in range(2, 12):  # the breaker is open: no call, no wait
        clock.now += RETRY_S / 20
        cached, took = timed(lambda t=t: feed.site_profiles(t, TM))
        assert cached is fresh and took < 0.05
    assert servicer.calls == calls
    assert gauge("powertrip_profile_age_seconds") == pytest.approx(RETRY_S / 2)
    servicer.mode, servicer.power = "ok", 0.75  # thawed, with news
    servicer.thaw.set()
    clock.now += RETRY_S  # the breaker half-opens: the next round asks again
    newer = feed.site_profiles(20.0, TM)
    assert newer.power.tolist() == [0.75, 0.75]
    assert gauge("powertrip_profiler_degraded") == 0
    assert gauge("powertrip_profile_age_seconds") == 0


@pytest.mark.reliability("R21")
def test_a_profile_older_than_the_stale_limit_holds_rounds_until_the_profiler_answers(profiler):
    servicer, port = profiler
    clock = Clock()
    feed = feed_for(port, clock, stale_s=60)
    feed.site_profiles(0.0, TM)
    servicer.mode = "refuse"
    clock.now += 30
    feed.site_profiles(1.0, TM)  # within the limit: the cache, degraded
    clock.now += 31  # now 61 s old: beyond the limit
    got: list = []
    held = threading.Thread(target=lambda: got.append(feed.site_profiles(2.0, TM)))
    held.start()
    held.join(1.0)
    assert held.is_alive() and not got  # the round waits for a trustworthy profile
    servicer.mode, servicer.power = "ok", 0.9
    held.join(5.0)
    assert got and got[0].power.tolist() == [0.9, 0.9]
    assert gauge("powertrip_profiler_degraded") == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.reliability("R21")
def test_a_profiler_down_at_start_is_waited_for_and_the_first_round_goes_on_once_it_answers(
    caplog,
):
    port = free_port()
    feed = feed_for(port)
    got: list = []
    first = threading.Thread(target=lambda: got.append(feed.site_profiles(0.0, TM)))
    first.start()
    time.sleep(2.0)  # attempts at about 0, 0.5, 1.5 s
    assert first.is_alive() and gauge("powertrip_profiler_degraded") == 1
    servicer = Profiler()
    server, _ = serve(servicer, port)
    try:
        first.join(5.0)
        assert got and got[0].size == 2
    finally:
        server.stop(None)
    waits = [m for m in caplog.messages if m.startswith("waiting for the profiler")]
    assert 1 <= len(waits) <= 3  # one line per group of attempts (1, 2, 4, ...), not per try


def test_a_stop_ends_the_wait_for_the_profiler_at_once():
    stop = threading.Event()
    feed = feed_for(free_port(), stop=stop)
    errors: list = []

    def first_round() -> None:
        try:
            feed.site_profiles(0.0, TM)
        except ProfilerWaitStopped as exc:
            errors.append(exc)

    waiting = threading.Thread(target=first_round)
    waiting.start()
    time.sleep(0.3)
    stop.set()
    started = time.monotonic()
    waiting.join(3.0)
    assert errors and time.monotonic() - started < 1.0
