"""The time model (the paper's Eqs. 3, 4, 6, 7 and its §5.1 emulation) against hand-computed
numbers, and the clocks that time advances on.

Constants used by hand: c = 2e8 m/s, 1 mi = 1609.344 m, B(d) = 10 Gbps / sqrt(1 + (d/1000 mi)^2),
decimal GB (1.5 GB = 12e9 bit).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from powertrip.config.sites import RoundTimeModel
from powertrip.rounds.clock import EmulatedClock, WallClock
from powertrip.sites.timing import (
    bandwidth_bps,
    centralized_round_time_s,
    comm_time_s,
    compute_time_s,
    effective_gpus,
    propagation_delay_s,
    round_time_s,
    straggler_max,
)

GB = 1e9

# ------------------------------------------------------------------------ d / c (Eq. 3, term 1)


def test_propagation_delay_is_distance_in_metres_over_fibre_speed():
    # Prepare: 100 mi = 160 934.4 m; 1000 mi = 1 609 344 m; 10 000 mi = 16 093 440 m.
    distances = [100.0, 1000.0, 10_000.0]

    # Execute
    delay = propagation_delay_s(distances)

    # Assert: d / 2e8 m/s
    assert delay == pytest.approx([8.04672e-4, 8.04672e-3, 8.04672e-2], rel=1e-12)


def test_propagation_delay_honours_a_custom_speed():
    # 1000 mi at the speed of light in vacuum (3e8 m/s): 1 609 344 / 3e8 = 5.36448 ms
    assert propagation_delay_s(1000.0, speed_m_per_s=3e8) == pytest.approx(5.36448e-3)


# ------------------------------------------------------------------------------------- B(d)


def test_bandwidth_is_flat_near_and_inverse_proportional_far():
    # Prepare
    distances = [0.0, 100.0, 1000.0, 10_000.0]

    # Execute
    bw = bandwidth_bps(distances)

    # Assert: 10e9/sqrt(1), 10e9/sqrt(1.01), 10e9/sqrt(2), 10e9/sqrt(101)
    expected = [10e9, 9.950371902e9, 7.071067812e9, 9.950371902e8]
    assert bw == pytest.approx(expected, rel=1e-9)


def test_bandwidth_uses_the_given_maximum_and_reference_distance():
    # 1 Gbps max, 500 mi reference, 1500 mi: 1e9 / sqrt(1 + 9) = 316 227 766 bit/s
    assert bandwidth_bps(1500.0, max_bps=1e9, reference_mi=500.0) == pytest.approx(
        1e9 / math.sqrt(10)
    )


# ------------------------------------------------------------------------------------- Eq. 3


def test_comm_time_of_a_1_5_gb_update_matches_the_spec_table():
    # Prepare: 12e9 bit over B(d) plus d/c, worked by hand:
    #   100 mi:    8.04672e-4 + 1.2 * sqrt(1.01) = 0.000804672 + 1.205985075 = 1.206789747 s
    #   1000 mi:   8.04672e-3 + 1.2 * sqrt(2)    = 0.00804672  + 1.697056275 = 1.705102995 s
    #   10 000 mi: 8.04672e-2 + 1.2 * sqrt(101)  = 0.0804672   + 12.05985075 = 12.14031795 s
    d = np.array([100.0, 1000.0, 10_000.0])

    # Execute
    c = comm_time_s(propagation_delay_s(d), bandwidth_bps(d), 1.5 * GB)

    # Assert
    assert c == pytest.approx([1.206789747, 1.705102995, 12.14031795], rel=1e-9)


def test_comm_time_of_a_1_gb_update_over_1000_miles():
    # 8e9 bit / (10e9 / sqrt 2) = 0.8 * sqrt 2 = 1.131370850 s, plus 8.04672 ms = 1.139417570 s
    c = comm_time_s(8.04672e-3, 10e9 / math.sqrt(2), 1.0 * GB)
    assert float(c) == pytest.approx(1.139417570, rel=1e-9)


def test_comm_time_round_trip_doubles_both_terms():
    # one way: 0.05 s + 8e9 bit / 4e9 bit/s = 2.05 s; round trip 4.1 s
    one_way = comm_time_s([0.05], [4e9], 1.0 * GB)
    both = comm_time_s([0.05], [4e9], 1.0 * GB, round_trip=True)
    assert one_way == pytest.approx([2.05])
    assert both == pytest.approx([4.1])


def test_comm_time_of_an_empty_update_is_the_latency_alone():
    assert comm_time_s([0.01, 0.08], [1e9, 1e9], 0.0) == pytest.approx([0.01, 0.08])


def test_comm_time_rejects_a_negative_update_size():
    with pytest.raises(ValueError, match="update size"):
        comm_time_s([0.01], [1e9], -1.0)


@pytest.mark.parametrize("bad_bandwidth", [0.0, -5e9])
def test_comm_time_rejects_a_link_without_bandwidth(bad_bandwidth):
    with pytest.raises(ValueError, match="bandwidth"):
        comm_time_s([0.01, 0.02], [1e9, bad_bandwidth], 1.0 * GB)


# ------------------------------------------------------------------------------------- Eq. 4


def test_straggler_max_is_the_slowest_site():
    # Prepare: the 10 000-mile site (12.14 s) holds the phase up
    times = [1.2068, 12.1403, 1.7051]

    # Execute
    slowest = straggler_max(times)

    # Assert
    assert slowest == 12.1403
    assert isinstance(slowest, float)


def test_straggler_max_needs_a_site():
    with pytest.raises(ValueError, match="at least one site"):
        straggler_max([])


# ------------------------------------------------------------------------------------- Eq. 6


@pytest.mark.parametrize(
    ("gpus", "power_w", "per_gpu_w", "expected"),
    [
        (8, 2000.0, 250.0, 8),  # exactly enough power for all 8
        (8, 5000.0, 250.0, 8),  # power for 20, but only 8 exist
        (8, 1000.0, 250.0, 4),  # power-capped: 1000 / 250 = 4
        (8, 1100.0, 250.0, 4),  # floor(4.4) = 4, a GPU cannot run at 40%
        (8, 249.0, 250.0, 0),  # not enough for a single GPU
        (8, 0.0, 250.0, 0),  # no power
        (8, -10.0, 250.0, 0),  # negative power is no power
    ],
)
def test_effective_gpus_is_min_of_physical_and_power_supported(gpus, power_w, per_gpu_w, expected):
    assert effective_gpus(gpus, power_w, per_gpu_w) == expected


def test_effective_gpus_under_uniform_power_is_floor_of_fraction_times_gpus():
    # Eq. 6 under uniform power: with P_max / p_gpu = G, a site at 0.55 of P_max runs
    # floor(0.55 * 20) = 11 GPUs
    assert effective_gpus(20, 0.55 * 20 * 300.0, 300.0) == 11


def test_effective_gpus_rejects_a_non_positive_power_per_gpu():
    with pytest.raises(ValueError, match="power per GPU"):
        effective_gpus(8, 1000.0, 0.0)


# --------------------------------------------------------------------- paper §5.1: T_ideal / P


def test_compute_time_is_ideal_time_over_power_fraction():
    # 60 s at 100 %, 120 s at 50 % ("twice as long"), 240 s at 25 %
    assert compute_time_s(60.0, [1.0, 0.5, 0.25]) == pytest.approx([60.0, 120.0, 240.0])


@pytest.mark.parametrize("bad_power", [0.0, -0.5])
def test_compute_time_rejects_a_site_without_power(bad_power):
    with pytest.raises(ValueError, match="power fraction"):
        compute_time_s(60.0, [1.0, bad_power])


# ----------------------------------------------------------------------------- round time


def test_per_site_max_round_is_the_slowest_compute_plus_comm():
    # Prepare: tau = 60 s; sites (P, C) = (1, 10), (0.5, 1), (0.25, 2)
    # per site: 60 + 10 = 70, 120 + 1 = 121, 240 + 2 = 242 -> the 25 % site sets the round: 242 s
    power, comm = [1.0, 0.5, 0.25], [10.0, 1.0, 2.0]

    # Execute
    t = round_time_s(RoundTimeModel.PER_SITE_MAX, 60.0, power, comm)

    # Assert
    assert t == pytest.approx(242.0)


def test_per_site_max_round_can_be_set_by_a_far_fast_site():
    # (1.0, 50 s) -> 60 + 50 = 110; (0.8, 1 s) -> 75 + 1 = 76: the far full-power site is slowest,
    # which differs from max compute (75) + max comm (50) = 125 of a phase-by-phase sum.
    t = round_time_s(RoundTimeModel.PER_SITE_MAX, 60.0, [1.0, 0.8], [50.0, 1.0])
    assert t == pytest.approx(110.0)


def test_aggregate_round_needs_the_federation_size():
    # W = N * tau is undefined without N; silently using the selected count would be Alg. 1's
    # mean-power estimator instead of Eq. 7
    with pytest.raises(ValueError, match="total_sites"):
        round_time_s(RoundTimeModel.AGGREGATE, 60.0, [1.0, 0.5, 0.25], [10.0, 1.0, 2.0])


def test_aggregate_round_uses_the_whole_federations_work_when_total_sites_is_given():
    # W = 100 * 60 s = 6000 s of 100 %-power work; 6000 / 1.75 = 3428.571428571 + 10 = 3438.571...
    t = round_time_s(
        RoundTimeModel.AGGREGATE, 60.0, [1.0, 0.5, 0.25], [10.0, 1.0, 2.0], total_sites=100
    )
    assert t == pytest.approx(3438.571428571)


def test_aggregate_and_per_site_max_agree_for_one_full_power_site():
    # one site at P = 1: 60 / 1 + 5 under both models
    for model in RoundTimeModel:
        assert round_time_s(model, 60.0, [1.0], [5.0], total_sites=1) == pytest.approx(65.0)


@pytest.mark.parametrize(
    ("power", "comm"),
    [([1.0, 0.5], [1.0]), ([], [])],
    ids=["shape-mismatch", "empty"],
)
def test_round_time_rejects_mismatched_or_empty_inputs(power, comm):
    with pytest.raises(ValueError, match="non-empty arrays of one shape"):
        round_time_s(RoundTimeModel.PER_SITE_MAX, 60.0, power, comm)


def test_round_time_rejects_an_unknown_model():
    with pytest.raises(ValueError, match="is not a valid RoundTimeModel"):
        round_time_s("bogus", 60.0, [1.0], [1.0])  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ centralized


@pytest.mark.parametrize(
    ("fraction", "expected"),
    [(0.25, 240.0), (0.5, 120.0), (1.0, 60.0)],  # 60 / 0.25, 60 / 0.5, 60 / 1; no comm term
)
def test_centralized_round_is_ideal_time_over_the_capped_power(fraction, expected):
    assert centralized_round_time_s(60.0, fraction) == pytest.approx(expected)


@pytest.mark.parametrize("bad_fraction", [0.0, -0.25, 1.5])
def test_centralized_round_rejects_a_power_fraction_outside_0_1(bad_fraction):
    with pytest.raises(ValueError, match="centralized power fraction"):
        centralized_round_time_s(60.0, bad_fraction)


# ------------------------------------------------------------------------------------- clocks


def test_emulated_clock_starts_where_told_and_moves_only_when_advanced():
    # Prepare
    clock = EmulatedClock(start_s=100.0)

    # Execute
    before = clock.now()
    after_round = clock.advance(242.0)
    after_pause = clock.advance(0.5)

    # Assert: 100 + 242 = 342, + 0.5 = 342.5; now() repeats the last value
    assert before == 100.0
    assert after_round == 342.0
    assert after_pause == clock.now() == 342.5


def test_emulated_clock_starts_at_zero_by_default_and_accepts_a_zero_step():
    clock = EmulatedClock()
    assert clock.now() == 0.0
    assert clock.advance(0.0) == 0.0


@pytest.mark.parametrize("bad_step", [-1.0, -1e-9, float("nan")])
def test_emulated_clock_refuses_to_go_back_or_advance_by_nan(bad_step):
    # Prepare
    clock = EmulatedClock(start_s=5.0)

    # Execute / Assert: refused, and the clock did not move
    with pytest.raises(ValueError, match="cannot advance the clock"):
        clock.advance(bad_step)
    assert clock.now() == 5.0


def test_wall_clock_counts_from_its_own_construction_and_never_goes_back():
    # Prepare: a clock made later has seen less time pass than one made earlier
    earlier = WallClock()
    later = WallClock()

    # Execute
    later_reading = later.now()
    earlier_reading = earlier.now()
    readings = [earlier.now() for _ in range(1000)]

    # Assert: no timing thresholds, only order
    assert 0.0 <= later_reading <= earlier_reading
    assert all(b >= a for a, b in zip(readings, readings[1:], strict=False))
