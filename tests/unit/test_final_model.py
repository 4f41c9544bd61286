"""A run hands back the model it trained: the emulator's result carries the final global model as
a ``state_dict`` the workload's model loads, the same whether its rounds were trained or served
from the trajectory cache, and a study keeps those models only when asked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import powertrip as pt
from powertrip.config.experiment import build_config
from powertrip.config.sites import RoundTimeModel
from powertrip.federation import build_federation, load_workload
from powertrip.rounds.emulate import EmulatedRun, Emulator, TimeModel, TrajectoryCache
from powertrip.selection.base import SelectAll, StaticTopK
from powertrip.sites.profiles import ModelledLinks, StaticPower, generate_sites
from tests.workloads import normalised_blobs

TINY = {
    "num_sites": 6,
    "num_samples": 600,
    "static_sweep": (3, 6),
    "max_rounds": 4,
    "policies": ("powertrip", "static-optimal", "select-all"),
    "target_accuracy": 0.99,  # not reached: every run trains its whole budget
    "ideal_compute_s": 10.0,
}


@pytest.fixture(scope="module")
def cfg():
    return build_config(None, **TINY)


@pytest.fixture(scope="module")
def data(cfg):
    return load_workload(cfg)


def _emulator(cfg, data, cache: TrajectoryCache) -> Emulator:
    sites = generate_sites(cfg.num_sites, np.random.default_rng(cfg.site_seed))
    fed = build_federation(cfg, data, 0)
    tm = TimeModel(cfg.ideal_compute_s, cfg.update_bytes, RoundTimeModel.PER_SITE_MAX)
    return Emulator(fed, sites, StaticPower(sites.base_power), ModelledLinks(sites), tm, 0, cache)


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_run_carries_the_final_global_model_as_a_loadable_state_dict(cfg, data):
    em = _emulator(cfg, data, TrajectoryCache())
    run = em.run(SelectAll(), None, 3)

    assert isinstance(run, EmulatedRun) and isinstance(run, pt.RunResult)
    assert list(run.model) == list(em.fed.trainer.model.state_dict())
    assert all(t.device.type == "cpu" for t in run.model.values())
    assert not _equal(run.model, em.state_dict(em.fed.initial_params))  # it trained
    # loaded into the workload's model, it scores what the run's last round reported
    model = build_federation(cfg, data, 0).trainer.model
    model.load_state_dict(run.model)
    accuracy, loss = em.fed.trainer.evaluate(
        dict(model.named_parameters()), em.fed.x_test, em.fed.y_test
    )
    assert accuracy == run.rounds[-1].accuracy
    assert loss == pytest.approx(run.rounds[-1].loss, rel=1e-6)


def test_a_cached_run_hands_back_the_model_training_would_have_given(cfg, data):
    cached = _emulator(cfg, data, TrajectoryCache())
    trained = cached.run(StaticTopK(3), None, 4)
    served = cached.run(StaticTopK(3), None, 4)  # every round from the cache
    assert cached.cache.hits == 4
    fresh = _emulator(cfg, data, TrajectoryCache(max_entries=0)).run(StaticTopK(3), None, 4)

    assert _equal(served.model, trained.model)
    assert _equal(served.model, fresh.model)


def test_a_round_served_to_another_policy_is_its_model_up_to_the_order_of_the_fold(cfg, data):
    """The cache is keyed by the set of sites: a policy that picks the same set in another
    order gets the round as first folded, equal to its own fold within float32 rounding."""
    cached = _emulator(cfg, data, TrajectoryCache())
    cached.run(StaticTopK(cfg.num_sites), None, 4)  # ranked order
    served = cached.run(SelectAll(), None, 4)  # index order, same sets: from the cache
    assert cached.cache.hits == 4
    fresh = _emulator(cfg, data, TrajectoryCache(max_entries=0)).run(SelectAll(), None, 4)

    for name, t in fresh.model.items():
        torch.testing.assert_close(served.model[name], t, rtol=1e-5, atol=1e-7)


def test_changing_the_handed_back_model_changes_nothing_the_emulator_keeps(cfg, data):
    em = _emulator(cfg, data, TrajectoryCache())
    first = em.run(SelectAll(), None, 2)
    before = {k: v.clone() for k, v in first.model.items()}
    for t in first.model.values():
        t.add_(1.0)
    again = em.run(SelectAll(), None, 2)  # from the cache

    assert em.cache.hits == 2
    assert _equal(again.model, before)


def test_a_model_with_buffers_loads_strictly_with_its_bookkeeping_from_the_start():
    name = pt.register_workload(normalised_blobs)
    cfg = build_config(
        None,
        workload=name,
        num_sites=3,
        policies=("select-all",),
        static_sweep=(),
        target_accuracy=0.99,
        max_rounds=2,
    )
    data = load_workload(cfg)
    em = _emulator(cfg, data, TrajectoryCache())
    run = em.run(SelectAll(), None, 2)

    model = build_federation(cfg, data, 0).trainer.model
    model.load_state_dict(run.model)  # strict: every entry present
    assert int(run.model["1.num_batches_tracked"]) == 0  # not averaged: the initial value
    assert not torch.equal(run.model["1.running_mean"], torch.zeros(32))  # averaged: moved


def test_a_study_keeps_no_model_unless_asked(cfg):
    result = pt.run_study(cfg)

    assert all(run.model is None for _, run in result.runs)
    with pytest.raises(LookupError, match="keep_models"):
        result.model("powertrip")


def test_a_study_keeps_every_model_or_those_of_the_policies_named(cfg):
    every = pt.run_study(cfg, keep_models=True)
    named = pt.run_study(cfg, keep_models={"powertrip", "static-optimal"})

    assert all(run.model is not None for _, run in every.runs)
    kept = {run.policy for _, run in named.runs if run.model is not None}
    assert kept == {"powertrip", f"static-{named.k_star}"}
    assert _equal(named.model("powertrip"), every.model("powertrip"))
    assert _equal(named.model("static-optimal"), every.model(f"static-{every.k_star}"))
    with pytest.raises(KeyError, match="no run of 'warp-drive'"):
        every.model("warp-drive")
