"""The static sweep's default scales with the site count (powertrip/config/presets.py,
docs/scale.md)."""

from __future__ import annotations

import pytest

from powertrip.config.experiment import ExperimentConfig, build_config
from powertrip.config.presets import rescaled_sweep, scaled_sweep


def test_at_100_sites_the_rule_is_the_old_fixed_default():
    assert scaled_sweep(100) == (10, 20, 30, 40, 50, 60, 70, 80, 90, 100)


@pytest.mark.parametrize(
    ("sites", "sweep"),
    [
        (1, (1,)),
        (4, (1, 2, 3, 4)),
        (6, (1, 2, 3, 4, 5, 6)),
        (25, (3, 5, 8, 10, 13, 15, 18, 20, 23, 25)),
        (150, (15, 30, 45, 60, 75, 90, 105, 120, 135, 150)),
        (1000, tuple(range(100, 1001, 100))),
    ],
)
def test_tenths_of_the_sites_rounded_half_up_at_least_one_deduplicated(sites, sweep):
    assert scaled_sweep(sites) == sweep


def test_the_sweep_always_ends_at_every_site_and_stays_in_range():
    for n in range(1, 400):
        sweep = scaled_sweep(n)
        assert sweep[-1] == n and sweep[0] >= 1
        assert list(sweep) == sorted(set(sweep))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        scaled_sweep(0)
    with pytest.raises(ValueError):
        scaled_sweep(10, (0.0, 0.5))
    with pytest.raises(ValueError):
        scaled_sweep(10, (1.5,))


def test_a_config_without_a_sweep_gets_the_scaled_one():
    assert ExperimentConfig(num_sites=150).static_sweep == scaled_sweep(150)
    assert ExperimentConfig().static_sweep == scaled_sweep(100)
    assert build_config(None, num_sites=40).static_sweep == scaled_sweep(40)


def test_a_given_sweep_is_kept_even_an_empty_one():
    assert ExperimentConfig(num_sites=150, static_sweep=(5, 50)).static_sweep == (5, 50)
    empty = build_config(
        None, num_sites=150, static_sweep=(), target_accuracy=0.5, policies=("select-all",)
    )
    assert empty.static_sweep == ()
    assert build_config("quick", num_sites=150, static_sweep=(7,)).static_sweep == (7,)


def test_the_presets_own_studies_are_unchanged():
    assert build_config("quick").static_sweep == (5, 10, 20, 30, 40, 50)
    assert build_config("paper-uniform").static_sweep == tuple(range(10, 101, 10))


def test_a_presets_sweep_keeps_its_shares_at_another_site_count():
    assert build_config("quick", num_sites=150).static_sweep == (15, 30, 60, 90, 120, 150)
    assert build_config("quick", num_sites=4).static_sweep == (1, 2, 3, 4)
    assert rescaled_sweep((5, 50), 50, 50) == (5, 50)
    assert rescaled_sweep((5, 50), 50, 1000) == (100, 1000)
