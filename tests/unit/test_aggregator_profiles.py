"""What the aggregator's policy sees of the sites: modelled links on the emulated clock (as the
emulator), the profiler's measurements on the wall clock once a site has been probed, and only
the sites whose worker is alive."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.rounds.clock import EmulatedClock
from powertrip.rounds.loop import RoundOutcome, TimeModel, run_rounds
from powertrip.selection.registry import PolicyContext, build_policy
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.run import AggregatorRun
from powertrip.services.common.config import load_config
from powertrip.sites.profiles import SiteProfile
from powertrip.sites.timing import comm_time_s
from powertrip.v1 import common_pb2, profiler_pb2


def run_with(clock: str) -> AggregatorRun:
    env = {
        "POWERTRIP_PROFILER_ADDR": "127.0.0.1:1",
        "POWERTRIP_NUM_SITES": "2",
        "POWERTRIP_NUM_SAMPLES": "1000",
        "POWERTRIP_CHECKPOINT_DIR": "",
        "POWERTRIP_CLOCK": clock,
        "POWERTRIP_INSECURE": "1",
    }
    return AggregatorRun(load_config(AggregatorConfig, env))


def reply() -> profiler_pb2.GetSiteProfilesResponse:
    probed = common_pb2.SiteProfile(
        site_id="site-001",
        power_fraction=0.5,
        modelled_latency_seconds=0.01,
        modelled_bandwidth_bytes_per_second=1e9,
        rtt_seconds=0.2,
        bandwidth_bytes_per_second=2.5e6,
        measured_at_seconds=3.0,
    )
    unprobed = common_pb2.SiteProfile(
        site_id="site-000",
        power_fraction=0.9,
        modelled_latency_seconds=0.02,
        modelled_bandwidth_bytes_per_second=5e8,
    )
    return profiler_pb2.GetSiteProfilesResponse(sites=[probed, unprobed])  # any order


@pytest.fixture(scope="module")
def wall():
    return run_with("wall")


def test_wall_clock_ranks_by_measured_links_once_probed(wall):
    profile = wall.feed.to_profile(reply(), wall.time_model)
    size = wall.time_model.update_bytes  # the real model's bytes on the wall clock
    want = comm_time_s(np.array([0.02, 0.1]), np.array([4e9, 2e7]), size, round_trip=True)
    assert np.allclose(profile.comm_s, want)
    assert profile.power.tolist() == [0.9, 0.5]


def test_a_probed_sites_measured_link_sizes_its_uploads_window(wall):
    wall.feed.to_profile(reply(), wall.time_model)
    assert wall.link_of(1) == (0.2, 2.5e6)
    assert wall.link_of(0) is None  # not probed yet: its share of the receive budget
    from powertrip.services.aggregator.servicer import AggregatorServicer

    budget = AggregatorServicer(wall).budget
    budget.open()
    assert budget.window(1) == 1 << 20  # 2 x 0.2 s x 2.5 MB/s = 1 MB: the 1 MiB floor
    assert budget.window(0) == 32 << 20  # the whole budget for a lone upload


def test_emulated_clock_uses_the_site_model_like_the_emulator():
    emulated = run_with("emulated")
    profile = emulated.feed.to_profile(reply(), emulated.time_model)
    tm = emulated.time_model
    want = comm_time_s(np.array([0.02, 0.01]), np.array([4e9, 8e9]), tm.update_bytes)
    assert np.allclose(profile.comm_s, want)


def test_a_profiler_with_another_number_of_sites_is_refused(wall):
    short = profiler_pb2.GetSiteProfilesResponse(sites=reply().sites[:1])
    with pytest.raises(RuntimeError, match="POWERTRIP_NUM_SITES"):
        wall.feed.to_profile(short, wall.time_model)


# -- the liveness mask in the round loop (docs/liveness.md) -------------------------------------
class Recorder:
    """An executor that trains nothing: it records what each round asked for."""

    def __init__(self) -> None:
        self.asked: list[list[int]] = []

    def evaluate_initial(self) -> tuple[float, float]:
        return 0.1, 2.0

    def execute(self, round_index, selected, profile, split_half):
        self.asked.append([int(s) for s in selected])
        if not selected.size:
            return None
        return RoundOutcome(0.1, 2.0, (1.0, 1.0, 1.0), int(selected.size))


def rounds_over(masks: list[list[bool] | None], policy: str = "select-all", k: int | None = None):
    sites = 6
    power = np.linspace(0.3, 1.0, sites)

    def profile_at(t: float) -> SiteProfile:
        mask = masks[len(rec.asked)]
        return SiteProfile(
            power,
            np.full(sites, 0.1),
            np.zeros(sites),
            available=None if mask is None else np.array(mask),
        )

    rec = Recorder()
    policy_ = build_policy(policy, PolicyContext(k_star=k))
    result = run_rounds(
        policy_, rec, profile_at, TimeModel(1.0, 1e3), EmulatedClock(), 0, None, len(masks)
    )
    return rec.asked, result.rounds


@pytest.mark.reliability("R1")
def test_the_round_loop_never_asks_an_unavailable_site_to_train():
    down = [True, False, True, True, False, True]
    asked, records = rounds_over([None, down, [False] * 6])
    assert asked == [[0, 1, 2, 3, 4, 5], [0, 2, 3, 5], []]
    assert [r.outcome for r in records] == ["completed", "completed", "failed"]
    assert records[2].sites == 0 and records[2].duration_s == 0  # no site: the clock stands


def test_a_power_aware_policy_ranks_unavailable_sites_last_and_picks_replacements():
    (best,), _ = rounds_over([None], "static-optimal", k=2)
    mask = [s not in best for s in range(6)]  # both sites it ranks first are down
    (masked,), _ = rounds_over([mask], "static-optimal", k=2)
    assert best == [5, 4] and masked == [3, 2]  # the next two, not a smaller round
