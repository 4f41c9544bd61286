"""The aggregator's curtailment-mode pieces that need no process: its settings, and the inbox
that keeps each site's delta whole for the round arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.curtail_run import CurtailmentRun
from powertrip.services.aggregator.delta_inbox import DeltaInbox
from powertrip.services.common.config import ConfigError, load_config
from powertrip.services.common.errors import Duplicate, StaleRound
from powertrip.services.common.grpc_server import build_server
from powertrip.services.common.tensor_receiver import TensorStreamReceiver
from powertrip.services.common.tensor_stream import encode
from powertrip.services.profiler.catalogue import SiteCatalogue
from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.profiler.feed import CarbonFeed
from powertrip.services.profiler.servicer import LinkProber, ProfilerServicer
from powertrip.v1 import profiler_pb2_grpc

BASE = {
    "POWERTRIP_PROFILER_ADDR": "x:1",
    "POWERTRIP_MODE": "curtailment",
    "POWERTRIP_INSECURE": "1",
}


def received(delta: dict[str, np.ndarray]) -> TensorStreamReceiver:
    rx = TensorStreamReceiver()
    parts = list(encode(delta, 8))
    rx.header(parts[0])
    for c in parts[1:-1]:
        rx.chunk(c)
    rx.trailer(parts[-1])
    return rx


def test_the_inbox_keeps_each_delta_and_its_weight():
    inbox = DeltaInbox(3, [2, 0])
    a, b = {"w": np.arange(6, dtype=np.float32)}, {"w": -np.ones(6, dtype=np.float32)}
    inbox.admit(0, 3)
    inbox.commit(0, received(b), 1.0)
    assert not inbox.wait(0.01)  # site 2 still missing
    inbox.admit(2, 3)
    inbox.commit(2, received(a), 7.0)
    assert inbox.wait(1.0)
    np.testing.assert_array_equal(inbox.deltas[2]["w"], a["w"])
    np.testing.assert_array_equal(inbox.deltas[0]["w"], b["w"])
    assert inbox.weights == {0: 1.0, 2: 7.0}


def test_the_inbox_refuses_stale_foreign_and_duplicate_updates_and_closes_missing_sites():
    inbox = DeltaInbox(3, [0, 1])
    with pytest.raises(StaleRound):
        inbox.admit(0, 2)
    with pytest.raises(StaleRound):
        inbox.admit(5, 3)
    inbox.admit(0, 3)
    with pytest.raises(Duplicate):
        inbox.admit(0, 3)
    inbox.close()
    assert inbox.failed == {0: "deadline", 1: "deadline"}
    with pytest.raises(StaleRound):
        inbox.admit(1, 3)


def test_curtailment_mode_reads_its_run_from_the_environment():
    cfg = load_config(
        AggregatorConfig,
        {
            **BASE,
            "POWERTRIP_CURTAIL_PRESET": "curtailment-quick",
            "POWERTRIP_SEED": "4",
            "POWERTRIP_REGIONS": "region-1, region-0",
            "POWERTRIP_PROVISIONING_S": "60",
        },
    )
    run = cfg.curtailment()
    assert (run.name, run.num_samples, run.seed) == ("curtailment-quick", 4_000, 4)
    assert run.regions == ("region-1", "region-0") and run.provisioning_s == 60


def test_curtailment_mode_needs_the_emulated_clock():
    with pytest.raises(ConfigError, match="POWERTRIP_CLOCK=emulated"):
        load_config(AggregatorConfig, {**BASE, "POWERTRIP_CLOCK": "wall"})


def test_an_unknown_curtailment_preset_is_refused():
    cfg = load_config(AggregatorConfig, {**BASE, "POWERTRIP_CURTAIL_PRESET": "nope"})
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        cfg.curtailment()


@pytest.fixture
def profiler_at():
    servers = []

    def start(env: dict[str, str]) -> str:
        cfg = load_config(ProfilerConfig, {**env, "POWERTRIP_INSECURE": "1"})
        servicer = ProfilerServicer(
            SiteCatalogue(cfg), LinkProber(cfg), CarbonFeed.build(cfg.curtail_config())
        )
        server, port, _ = build_server(
            [lambda s: profiler_pb2_grpc.add_ProfilerServiceServicer_to_server(servicer, s)],
            "127.0.0.1:0",
            cfg,
        )
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(grace=None)


def test_the_run_takes_the_profilers_availability_for_its_own_sites(profiler_at):
    quick = {"POWERTRIP_CURTAIL_PRESET": "curtailment-quick", "POWERTRIP_NUM_SITES": "3"}
    addr = profiler_at(quick)
    run = CurtailmentRun(
        load_config(AggregatorConfig, {**BASE, **quick, "POWERTRIP_PROFILER_ADDR": addr})
    )
    sites, threshold, trace = run.feed.availability()
    run.stop()
    assert [s.site for s in sites] == ["site-000", "site-001", "site-002"]
    assert threshold == 100.0 and trace.label == "synthetic-carbon"


def test_a_profiler_with_other_sites_is_refused_naming_the_setting(profiler_at):
    quick = {"POWERTRIP_CURTAIL_PRESET": "curtailment-quick", "POWERTRIP_NUM_SITES": "3"}
    addr = profiler_at({**quick, "POWERTRIP_REGIONS": "region-0,region-1"})
    run = CurtailmentRun(
        load_config(AggregatorConfig, {**BASE, **quick, "POWERTRIP_PROFILER_ADDR": addr})
    )
    with pytest.raises(RuntimeError, match="POWERTRIP_REGIONS"):
        run.feed.availability()
    run.stop()
