"""The vectorised batch orders, seeds and round layout equal the per-site ones bit for bit, so
the emulator's training does not change with how a round's plan is computed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from powertrip.aggregation.fedavg import StreamingFedAvg
from powertrip.learning.batch_orders import epoch_orders, site_seeds
from powertrip.learning.batches import (
    LocalTrainingConfig,
    round_batches,
    round_orders,
    site_schedule,
)
from powertrip.learning.models import build_model
from powertrip.learning.trainer import SiteTrainer
from powertrip.rounds.emulate import site_seed


def test_site_seeds_equal_site_seed_including_the_fallback_range() -> None:
    sites = np.r_[np.arange(300), 2**32 - 1]
    assert site_seeds(7, 3, sites).tolist() == [site_seed(7, 3, int(s)) for s in sites]
    big = [0, 5, 2**33]  # a word beyond 32 bits: numpy's SeedSequence per site
    assert site_seeds(2**40, 1, big).tolist() == [site_seed(2**40, 1, s) for s in big]


def test_epoch_orders_are_numpys_permutations_epoch_after_epoch() -> None:
    rng = np.random.default_rng(0)
    sizes = np.r_[1, 2, 3, 64, 257, rng.integers(1, 40, 300)]
    seeds = rng.integers(0, 2**32, sizes.size)
    orders = epoch_orders(seeds, sizes, 3)
    for j, (n, seed) in enumerate(zip(sizes.tolist(), seeds.tolist(), strict=True)):
        gen = np.random.default_rng(seed)
        for e in range(3):
            assert orders[j, e, :n].tolist() == gen.permutation(n).tolist()
            assert (orders[j, e, n:] == -1).all()


@pytest.mark.parametrize(
    ("sites", "size"), [(2000, 3), (5, 300)]
)  # the vectorised path, then the per-site one
def test_round_orders_take_either_path_to_the_same_orders(sites: int, size: int) -> None:
    config = LocalTrainingConfig(lr=0.1, batch_size=4, local_epochs=2)
    sizes = np.full(sites, size) - np.arange(sites) % 2
    seeds = site_seeds(1, 2, range(sites))
    orders = round_orders(config, sizes, seeds)
    for j in (0, 1, sites - 1):
        sched = site_schedule(config, int(sizes[j]), int(seeds[j]))
        epochs = orders[j, :, : sizes[j]]
        padded = np.full((2, math.ceil(sizes[j] / 4) * 4), -1)
        padded[:, : sizes[j]] = epochs
        assert np.array_equal(sched, padded.reshape(-1, 4))


def _reference_layout(config, site_indices, seeds, rows):
    """The per-site layout ``round_batches`` had before it was vectorised."""
    schedules = [site_schedule(config, len(i), s) for i, s in zip(site_indices, seeds, strict=True)]
    steps = np.array([s.shape[0] for s in schedules])
    order = np.argsort(-steps, kind="stable")
    gather = np.zeros((int(steps.max()), rows, config.batch_size), dtype=np.int64)
    mask = np.zeros(gather.shape, dtype=np.float32)
    for pos, j in enumerate(order):
        sched, idx = schedules[j], np.asarray(site_indices[j])
        gather[: sched.shape[0], pos] = np.where(sched >= 0, idx[np.clip(sched, 0, None)], 0)
        mask[: sched.shape[0], pos] = sched >= 0
    return steps, order, gather, mask


@pytest.mark.parametrize("cap", [None, 3])
def test_round_batches_lays_out_what_site_schedule_gives(cap: int | None) -> None:
    config = LocalTrainingConfig(lr=0.1, batch_size=5, local_epochs=2, max_local_steps=cap)
    rng = np.random.default_rng(3)
    parts = [rng.choice(500, int(n), replace=False) for n in rng.integers(1, 17, 40)]
    seeds = site_seeds(0, 4, range(40))
    plan = round_batches(config, parts, seeds, 42)
    steps, order, gather, mask = _reference_layout(config, parts, seeds.tolist(), 42)
    assert np.array_equal(plan.steps, steps) and np.array_equal(plan.order, order)
    assert np.array_equal(plan.gather, gather) and np.array_equal(plan.mask, mask)


def test_training_does_not_depend_on_how_many_sites_share_a_step() -> None:
    torch.manual_seed(0)
    model = build_model("cnn1d", 10, (1, 40))
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(600, 1, 40), torch.randint(0, 10, (600,))
    parts = [np.arange(3 * i, 3 * i + 3) for i in range(200)]
    seeds = site_seeds(0, 1, range(200))
    config = LocalTrainingConfig(lr=0.1, batch_size=20)
    few = SiteTrainer(model, config, device="cpu", max_parallel_sites=1)
    many = SiteTrainer(model, config, device="cpu", max_parallel_sites=128)
    a, b = (t.train(params, x, y, parts, seeds) for t in (few, many))
    assert all(torch.equal(a.deltas[k], b.deltas[k]) for k in params)
    assert np.array_equal(a.loss, b.loss)


def test_split_half_fold_with_the_full_folds_norms_is_the_same_fold() -> None:
    rng = np.random.default_rng(1)
    rows = {"w": rng.standard_normal((9, 30, 4), dtype=np.float32)}
    template = {"w": np.zeros((30, 4), np.float32)}
    weights = rng.integers(1, 50, 9).astype(np.float64)
    full = StreamingFedAvg(template)
    sq = full.add_rows(rows, weights)
    halves = {"w": rows["w"][::2]}
    own, reused = StreamingFedAvg(template), StreamingFedAvg(template)
    assert np.array_equal(own.add_rows(halves, weights[::2]), sq[::2])
    reused.add_rows(halves, weights[::2], sq[::2])
    assert np.array_equal(own.mean_delta()["w"], reused.mean_delta()["w"])
    assert own.dispersion() == reused.dispersion()
