"""The emulator keeps each site's local optimizer state between the rounds that pick it
(``keep_state=True``: DiLoCo-style inner AdamW), or starts every round fresh."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from powertrip.config.experiment import build_config
from powertrip.config.recipe import LocalOptimizer
from powertrip.config.sites import RoundTimeModel
from powertrip.federation import build_federation, load_workload
from powertrip.rounds.emulate import Emulator, TimeModel, TrajectoryCache
from powertrip.selection.base import StaticTopK
from powertrip.sites.profiles import ModelledLinks, StaticPower, generate_sites

TINY = {
    "num_sites": 6,
    "num_samples": 600,
    "static_sweep": (2,),
    "max_rounds": 3,
    "policies": ("select-all",),
    "ideal_compute_s": 10.0,
}


@pytest.fixture(scope="module")
def setup():
    cfg = build_config(None, **TINY)
    return cfg, load_workload(cfg)


def _emulator(setup, recipe: LocalOptimizer, cache: TrajectoryCache | None = None):
    cfg, data = setup
    sites = generate_sites(cfg.num_sites, np.random.default_rng(cfg.site_seed))
    fed = build_federation(cfg, data, 0)
    trainer = fed.trainer
    trainer.config = dataclasses.replace(trainer.config, optimizer=recipe)
    given: list[list] = []  # the states each round's train call was handed
    train = trainer.train

    def spy(*args, **kwargs):
        states = args[5] if len(args) > 5 else kwargs.get("states")
        given.append(states)
        return train(*args, **kwargs)

    trainer.train = spy
    tm = TimeModel(cfg.ideal_compute_s, cfg.update_bytes, RoundTimeModel.PER_SITE_MAX)
    em = Emulator(fed, sites, StaticPower(sites.base_power), ModelledLinks(sites), tm, 0, cache)
    return em, given


def test_a_site_picked_again_resumes_its_moments_and_step_count(setup):
    em, given = _emulator(setup, LocalOptimizer(name="adamw", weight_decay=0.1))
    first = em.run(StaticTopK(2), None, 3)
    assert given[0] == [None, None]  # nothing to resume in round one
    steps = [s.step for s in given[1]]
    assert all(s > 0 for s in steps)  # the same two sites, with their round-one step counts
    assert [s.step for s in given[2]] == [2 * s for s in steps]  # one round's steps more
    again = em.run(StaticTopK(2), None, 3)  # a new run starts from fresh states, no cache
    assert again.rounds == first.rounds
    assert given[3] == [None, None]


def test_keep_state_false_starts_every_round_fresh_and_shares_rounds(setup):
    cache = TrajectoryCache()
    em, given = _emulator(setup, LocalOptimizer(name="adamw", keep_state=False), cache)
    em.run(StaticTopK(2), None, 3)
    assert given == [None, None, None]
    em.run(StaticTopK(2), None, 3)
    assert cache.hits == 3 and len(given) == 3
