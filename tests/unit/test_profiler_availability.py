"""The profiler serves the curtailment study's availability and carbon intensity: the same
episodes, regions and trace that ``powertrip curtail`` builds from the same settings."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from powertrip.config.curtailment import build_curtail_config
from powertrip.curtailment.availability import AvailabilityRule, availability_from_trace
from powertrip.curtailment.sites import build_sites, load_carbon
from powertrip.services.common.config import ConfigError, load_config
from powertrip.services.common.grpc_server import build_server
from powertrip.services.common.wire import from_availability_reply
from powertrip.services.profiler.catalogue import SiteCatalogue
from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.profiler.feed import CarbonFeed
from powertrip.services.profiler.servicer import LinkProber, ProfilerServicer
from powertrip.v1 import profiler_pb2, profiler_pb2_grpc


@pytest.fixture
def stub_for():
    servers = []

    def start(cfg: ProfilerConfig, carbon: CarbonFeed | None):
        servicer = ProfilerServicer(SiteCatalogue(cfg), LinkProber(cfg), carbon)
        server, port, _ = build_server(
            [lambda s: profiler_pb2_grpc.add_ProfilerServiceServicer_to_server(servicer, s)],
            "127.0.0.1:0",
            cfg,
        )
        server.start()
        servers.append(server)
        return profiler_pb2_grpc.ProfilerServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

    yield start
    for server in servers:
        server.stop(grace=None)


PLAIN = {"POWERTRIP_INSECURE": "1"}
ENV = {
    **PLAIN,
    "POWERTRIP_NUM_SITES": "6",
    "POWERTRIP_CURTAIL_PRESET": "curtailment-quick",
    "POWERTRIP_SITE_REGIONS": "region-2,region-0",
    "POWERTRIP_CURTAIL_THRESHOLD": "150",
    "POWERTRIP_PROVISIONING_S": "300",
}


def test_availability_equals_the_studys_for_the_same_settings(stub_for):
    cfg = load_config(ProfilerConfig, ENV)
    stub = stub_for(cfg, CarbonFeed.build(cfg.curtail_config()))
    sites, rule, trace = from_availability_reply(
        stub.GetAvailability(profiler_pb2.GetAvailabilityRequest(), timeout=5)
    )

    study_cfg = build_curtail_config(
        "curtailment-quick", regions=("region-2", "region-0"), threshold=150, provisioning_s=300
    )
    study_trace = load_carbon(study_cfg)
    study_rule = AvailabilityRule(150, study_cfg.hold_s, 300)
    pairs = [(f"site-{i:03d}", s.region) for i, s in enumerate(build_sites(study_cfg, study_trace))]
    assert rule == study_rule
    assert sites == availability_from_trace(study_trace, pairs, study_rule)
    assert [s.region for s in sites] == ["region-2", "region-0"]
    assert any(e.usable for s in sites for e in s.episodes)
    assert trace.regions == study_trace.regions and trace.label == "synthetic-carbon"
    np.testing.assert_array_equal(trace.intensity, study_trace.intensity)
    np.testing.assert_array_equal(trace.time_s, study_trace.time_s)
    assert trace.start == study_trace.start and trace.step_s == study_trace.step_s


def test_site_profiles_carry_region_and_intensity_now_wrapping_over_the_regions(stub_for):
    cfg = load_config(ProfilerConfig, ENV)
    feed = CarbonFeed.build(cfg.curtail_config())
    stub = stub_for(cfg, feed)
    t = 7_000.0
    reply = stub.GetSiteProfiles(profiler_pb2.GetSiteProfilesRequest(time_seconds=t), timeout=5)
    now = feed.trace.intensity_at(t)
    regions = ["region-2", "region-0"] * 3
    assert [p.region for p in reply.sites] == regions
    assert [p.carbon_intensity for p in reply.sites] == [
        now[feed.trace.regions.index(r)] for r in regions
    ]


def test_without_a_carbon_feed_availability_is_not_found_and_profiles_have_no_region(stub_for):
    cfg = load_config(ProfilerConfig, {**PLAIN, "POWERTRIP_NUM_SITES": "2"})
    stub = stub_for(cfg, None)
    with pytest.raises(grpc.RpcError) as err:
        stub.GetAvailability(profiler_pb2.GetAvailabilityRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    reply = stub.GetSiteProfiles(profiler_pb2.GetSiteProfilesRequest(), timeout=5)
    assert [(p.region, p.carbon_intensity) for p in reply.sites] == [("", 0.0), ("", 0.0)]


def test_a_region_missing_from_the_trace_is_refused_when_the_feed_is_built():
    cfg = load_config(ProfilerConfig, {**PLAIN, "POWERTRIP_SITE_REGIONS": "CAISO_NORTH"})
    with pytest.raises(ValueError, match="CAISO_NORTH"):
        CarbonFeed.build(cfg.curtail_config())


def test_a_bad_curtailment_setting_names_its_variable():
    with pytest.raises(ConfigError, match="POWERTRIP_PROVISIONING_S"):
        load_config(ProfilerConfig, {**PLAIN, "POWERTRIP_PROVISIONING_S": "-1"})
