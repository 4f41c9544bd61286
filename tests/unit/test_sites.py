"""Sites: the generator of the paper's set-up, SiteSet validation, the power/link sources and
profiles."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.config.sites import DistanceMode
from powertrip.sites.profiles import (
    ModelledLinks,
    SiteProfile,
    SiteSet,
    StaticPower,
    generate_sites,
    profile_at,
)

GB = 1e9


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def hand_made_sites() -> SiteSet:
    """Three sites at 100, 1000 and 10 000 mi with the Eq. 3 link model worked by hand."""
    return SiteSet(
        distance_mi=np.array([100.0, 1000.0, 10_000.0]),
        bandwidth_bps=np.array([10e9 / np.sqrt(1.01), 10e9 / np.sqrt(2.0), 10e9 / np.sqrt(101.0)]),
        latency_s=np.array([8.04672e-4, 8.04672e-3, 8.04672e-2]),
        base_power=np.array([0.9, 0.5, 0.2]),
    )


# ------------------------------------------------------------------------- generate_sites


def test_stratified_draw_puts_exactly_22_of_100_sites_within_1000_miles():
    # Prepare / Execute
    sites = generate_sites(100, rng(0))

    # Assert: 22 in [100, 1000) mi (the paper's 22 within 1000 mi), 78 in [1000, 10 000] mi
    d = sites.distance_mi
    assert sites.size == 100
    assert int((d < 1000.0).sum()) == 22
    assert int((d <= 1000.0).sum()) == 22  # what the fixed-radius baseline (<= 1000 mi) sees
    assert d.min() >= 100.0 and d.max() <= 10_000.0


def test_stratified_draw_shuffles_the_near_sites_among_the_ids():
    # the 22 near sites are not simply ids 0..21
    near_ids = np.flatnonzero(generate_sites(100, rng(0)).distance_mi < 1000.0)
    assert not np.array_equal(near_ids, np.arange(22))


@pytest.mark.parametrize(
    ("num_sites", "near"),
    [(50, 11), (10, 2), (3, 1), (1, 0)],  # round(n * 22 / 100): 11, 2.2 -> 2, 0.66 -> 1, 0.22 -> 0
)
def test_stratified_draw_scales_the_near_share_with_the_number_of_sites(num_sites, near):
    sites = generate_sites(num_sites, rng(3))
    assert sites.size == num_sites
    assert int((sites.distance_mi < 1000.0).sum()) == near


def test_uniform_draw_puts_about_9_of_100_sites_within_1000_miles():
    # Prepare: U(100, 10 000) puts 900 / 9900 = 9.09 % of the sites within 1000 mi, not 22
    draws = [generate_sites(100, rng(seed), DistanceMode.UNIFORM) for seed in range(200)]

    # Execute
    near_counts = [int((s.distance_mi <= 1000.0).sum()) for s in draws]

    # Assert: the mean over 200 seeded draws is 9.09 +- 0.2 (binomial sd 2.87 / sqrt 200)
    assert np.mean(near_counts) == pytest.approx(9.09, abs=0.6)
    assert all(s.distance_mi.min() >= 100.0 and s.distance_mi.max() <= 10_000.0 for s in draws)


def test_distance_mode_may_be_given_by_its_string_value():
    a = generate_sites(20, rng(5), "uniform")  # type: ignore[arg-type]
    b = generate_sites(20, rng(5), DistanceMode.UNIFORM)
    assert np.array_equal(a.distance_mi, b.distance_mi)


def test_unknown_distance_mode_is_rejected():
    with pytest.raises(ValueError):
        generate_sites(20, rng(5), "gaussian")  # type: ignore[arg-type]


def test_generated_links_follow_the_distance_model():
    # Prepare
    sites = generate_sites(100, rng(1))
    d = sites.distance_mi

    # Execute / Assert: latency = d * 1609.344 / 2e8, B = 10e9 / sqrt(1 + (d / 1000)^2)
    assert sites.latency_s == pytest.approx(d * 1609.344 / 2e8, rel=1e-12)
    assert sites.bandwidth_bps == pytest.approx(10e9 / np.sqrt(1.0 + (d / 1000.0) ** 2), rel=1e-12)


def test_default_power_is_drawn_from_0_1_to_1():
    power = generate_sites(1000, rng(2)).base_power
    assert power.min() >= 0.1 and power.max() <= 1.0
    assert power.min() < 0.15 and power.max() > 0.95  # the whole range is used


def test_power_range_is_respected():
    power = generate_sites(500, rng(2), power_range=(0.25, 0.5)).base_power
    assert power.min() >= 0.25 and power.max() <= 0.5


def test_a_degenerate_power_range_gives_every_site_that_power():
    power = generate_sites(10, rng(2), power_range=(0.4, 0.4)).base_power
    assert np.array_equal(power, np.full(10, 0.4))


@pytest.mark.parametrize(
    "bad_range",
    [(0.0, 1.0), (-0.1, 0.5), (0.6, 0.5), (0.1, 1.1)],
    ids=["zero-low", "negative-low", "low-above-high", "high-above-one"],
)
def test_invalid_power_range_is_rejected(bad_range):
    with pytest.raises(ValueError, match="power range"):
        generate_sites(10, rng(), power_range=bad_range)


@pytest.mark.parametrize("bad_count", [0, -3])
def test_at_least_one_site_is_required(bad_count):
    with pytest.raises(ValueError, match="at least one site"):
        generate_sites(bad_count, rng())


@pytest.mark.parametrize("mode", list(DistanceMode))
def test_generation_is_deterministic_per_seed(mode):
    # Prepare / Execute
    a, b, c = (generate_sites(40, rng(seed), mode) for seed in (7, 7, 8))

    # Assert: same seed -> same sites, a different seed -> different sites
    for field in ("distance_mi", "bandwidth_bps", "latency_s", "base_power"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
        assert not np.array_equal(getattr(a, field), getattr(c, field))


# ---------------------------------------------------------------------------------- SiteSet


@pytest.mark.parametrize("field", ["bandwidth_bps", "latency_s", "base_power"])
def test_site_set_rejects_columns_of_different_lengths(field):
    # Prepare: three sites, one column with only two entries
    columns = {
        "distance_mi": np.array([100.0, 200.0, 300.0]),
        "bandwidth_bps": np.ones(3),
        "latency_s": np.ones(3),
        "base_power": np.ones(3),
    }
    columns[field] = np.ones(2)

    # Execute / Assert
    with pytest.raises(ValueError, match=f"SiteSet.{field} must have shape"):
        SiteSet(**columns)


def test_site_set_size_is_the_number_of_sites():
    assert hand_made_sites().size == 3


# --------------------------------------------------------------------- sources and profiles


def test_static_power_returns_the_same_fractions_at_every_time():
    source = StaticPower(np.array([0.9, 0.5, 0.2]))
    for t in (0.0, 3600.0, 1e7):
        assert np.array_equal(source.power_at(t), [0.9, 0.5, 0.2])


def test_modelled_links_are_the_site_sets_latency_and_bandwidth_at_every_time():
    # Prepare
    sites = hand_made_sites()
    links = ModelledLinks(sites)

    # Execute
    latency, bandwidth = links.links_at(1234.0)

    # Assert
    assert np.array_equal(latency, sites.latency_s)
    assert np.array_equal(bandwidth, sites.bandwidth_bps)


def test_profile_at_combines_power_eq3_comm_and_distance():
    # Prepare: 1.5 GB over the hand-made links (see test_timing for the arithmetic)
    sites = hand_made_sites()

    # Execute
    profile = profile_at(sites, StaticPower(sites.base_power), ModelledLinks(sites), 0.0, 1.5 * GB)

    # Assert
    assert isinstance(profile, SiteProfile)
    assert profile.size == 3
    assert np.array_equal(profile.power, [0.9, 0.5, 0.2])
    assert profile.comm_s == pytest.approx([1.206789747, 1.705102995, 12.14031795], rel=1e-9)
    assert np.array_equal(profile.distance_mi, [100.0, 1000.0, 10_000.0])


def test_profile_at_round_trip_doubles_the_comm_time():
    sites = hand_made_sites()
    links = ModelledLinks(sites)
    profile = profile_at(sites, StaticPower(sites.base_power), links, 0.0, 1.5 * GB, True)
    assert profile.comm_s == pytest.approx([2.413579495, 3.41020599, 24.2806359], rel=1e-9)


class HalvingPower:
    """A time-varying source: every site's power halves after the first hour."""

    def power_at(self, t_s: float) -> np.ndarray:
        return np.array([0.8, 0.4]) * (0.5 if t_s >= 3600.0 else 1.0)


class CongestedLinks:
    """A measured-link source: 10 ms and 8 Gbps, dropping to 2 Gbps after the first hour."""

    def links_at(self, t_s: float) -> tuple[np.ndarray, np.ndarray]:
        bw = 2e9 if t_s >= 3600.0 else 8e9
        return np.array([0.01, 0.01]), np.array([bw, bw])


def test_profile_at_reads_power_and_links_at_the_given_time():
    # Prepare: 1 GB = 8e9 bit: 0.01 + 8e9 / 8e9 = 1.01 s early, 0.01 + 8e9 / 2e9 = 4.01 s late
    sites = SiteSet(
        distance_mi=np.array([500.0, 700.0]),
        bandwidth_bps=np.ones(2),
        latency_s=np.ones(2),
        base_power=np.ones(2),
    )

    # Execute
    early = profile_at(sites, HalvingPower(), CongestedLinks(), 0.0, 1.0 * GB)
    late = profile_at(sites, HalvingPower(), CongestedLinks(), 7200.0, 1.0 * GB)

    # Assert
    assert early.power == pytest.approx([0.8, 0.4])
    assert late.power == pytest.approx([0.4, 0.2])
    assert early.comm_s == pytest.approx([1.01, 1.01])
    assert late.comm_s == pytest.approx([4.01, 4.01])
    assert np.array_equal(late.distance_mi, [500.0, 700.0])
