"""The local optimizer seam: one recipe, validated once, and per-site state over stacked rows
that behaves exactly like torch's optimizer run separately on each site."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from powertrip.config.recipe import LocalOptimizer, decays
from powertrip.learning.lr_schedule import lr_factors
from powertrip.learning.site_optim import SiteOptimizer

SHAPES = {"emb.weight": (5, 3), "fc.weight": (4, 3), "fc.bias": (4,)}


def _stacked(rows: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(rows, *s, generator=g) for n, s in SHAPES.items()}


def _grads(rows: int, step: int) -> dict[str, torch.Tensor]:
    return _stacked(rows, seed=1000 + step)


def _torch_reference(recipe: LocalOptimizer, start: dict, row: int, grad_steps: list[dict]):
    """One site alone with torch.optim: decay groups by ``decays``, LambdaLR, clip_grad_norm_."""
    ps = {n: t[row].clone().requires_grad_(True) for n, t in start.items()}
    decay = [p for n, p in ps.items() if decays(n, tuple(p.shape))]
    rest = [p for n, p in ps.items() if not decays(n, tuple(p.shape))]
    groups = [
        {"params": decay, "weight_decay": recipe.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    if recipe.name == "adamw":
        opt = torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, eps=recipe.eps)
    else:
        opt = torch.optim.SGD(
            groups,
            lr=recipe.lr,
            momentum=recipe.momentum if recipe.name != "sgd" else 0,
            nesterov=recipe.name == "nesterov",
        )

    def factor(k: int) -> float:
        return float(
            lr_factors(
                np.array([k]),
                recipe.schedule,
                recipe.warmup_steps,
                recipe.total_steps,
                recipe.min_lr_ratio,
            )[0]
        )

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    for g in grad_steps:
        for n, p in ps.items():
            p.grad = g[n][row].clone()
        if recipe.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(list(ps.values()), recipe.clip_norm)
        opt.step()
        sched.step()
    return {n: p.detach() for n, p in ps.items()}


RECIPES = [
    LocalOptimizer(name="adamw", lr=0.01, weight_decay=0.1),
    LocalOptimizer(
        name="adamw",
        lr=0.02,
        weight_decay=0.05,
        schedule="cosine",
        warmup_steps=2,
        total_steps=6,
        min_lr_ratio=0.1,
        clip_norm=1.5,
    ),
    LocalOptimizer(name="momentum", lr=0.05, weight_decay=0.01, clip_norm=2.0),
    LocalOptimizer(name="nesterov", lr=0.05, schedule="wsd", total_steps=5),
    LocalOptimizer(name="sgd", lr=0.1, clip_norm=0.5),
]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: f"{r.name}-{r.schedule}")
def test_stacked_rows_equal_torch_optimizer_run_on_each_site_alone(recipe):
    """Sites finish after 5, 3 and 1 steps (the active prefix shrinks): a finished site must
    neither move nor advance its moments or step count."""
    rows, active = 3, [3, 3, 3, 2, 1]
    params = _stacked(rows)
    start = {n: t.clone() for n, t in params.items()}
    opt = SiteOptimizer(recipe, rows)
    seen: list[list[dict]] = [[] for _ in range(rows)]
    for s, a in enumerate(active):
        g = _grads(rows, s)
        opt.update(params, g, a)
        for r in range(a):
            seen[r].append(g)
    assert list(opt.steps) == [5, 4, 3]
    for r in range(rows):
        want = _torch_reference(recipe, start, r, seen[r])
        for n in SHAPES:
            torch.testing.assert_close(params[n][r], want[n], rtol=1e-5, atol=1e-6)


def test_a_site_resumes_its_own_moments_and_step_count_in_a_later_round():
    recipe = LocalOptimizer(
        name="adamw", lr=0.01, weight_decay=0.1, schedule="cosine", total_steps=8, warmup_steps=1
    )
    params = _stacked(2)
    start = {n: t.clone() for n, t in params.items()}
    first = SiteOptimizer(recipe, 2)
    for s in range(3):
        first.update(params, _grads(2, s), 2 if s < 2 else 1)
    saved = first.export([1, 0])  # the next round stacks the sites the other way round
    assert [st.step for st in saved] == [2, 3]
    second = SiteOptimizer(recipe, 2)
    swapped = {n: t.flip(0).clone() for n, t in params.items()}
    second.load(saved, swapped)
    for s in range(3, 5):
        second.update(swapped, _grads(2, s), 2)
    seen = [
        [_grads(2, s) for s in (0, 1)]
        + [{n: g.flip(0) for n, g in _grads(2, s).items()} for s in (3, 4)]
    ]
    want = _torch_reference(recipe, start, 1, seen[0])
    for n in SHAPES:
        torch.testing.assert_close(swapped[n][0], want[n], rtol=1e-5, atol=1e-6)


def test_a_site_given_no_state_starts_fresh():
    recipe = LocalOptimizer(name="adamw", lr=0.01)
    params = _stacked(2)
    opt = SiteOptimizer(recipe, 2)
    opt.update(params, _grads(2, 0), 2)
    fresh = SiteOptimizer(recipe, 2)
    fresh.load([None, opt.export([1])[0]], params)
    assert list(fresh.steps) == [0, 1]
    assert not fresh.export([0])[0].moments["fc.weight"]["exp_avg"].any()


def test_plain_sgd_is_exactly_the_old_in_place_step():
    recipe = LocalOptimizer(lr=0.3)
    params, g = _stacked(4), _grads(4, 0)
    old = {n: t.clone() for n, t in params.items()}
    for n, t in old.items():
        t[:3].sub_(g[n][:3], alpha=0.3)
    SiteOptimizer(recipe, 4).update(params, g, 3)
    for n in SHAPES:
        assert torch.equal(params[n], old[n])


def test_schedules_at_known_steps():
    steps = np.array([0, 1, 3, 4, 7, 9, 20])
    assert lr_factors(steps, "constant", warmup_steps=2).tolist() == [0.5, 1, 1, 1, 1, 1, 1]
    cos = lr_factors(steps, "cosine", warmup_steps=2, total_steps=10, min_lr_ratio=0.1)
    mid = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 2 / 8))  # step 4: 2 of 8 decay steps
    np.testing.assert_allclose(
        cos[:4], [0.5, 1.0, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 8)), mid]
    )
    assert cos[-1] == pytest.approx(0.1)
    wsd = lr_factors(steps, "wsd", warmup_steps=0, total_steps=10, min_lr_ratio=0.0)
    # decay over the last 20 % (2 steps): stable through step 8, 0.5 at step 9, 0 from 10 on
    assert wsd.tolist() == [1, 1, 1, 1, 1, 0.5, 0]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "adam"}, "name"),
        ({"lr": 0}, "lr"),
        ({"lr": float("inf")}, "lr"),
        ({"clip_norm": 0}, "clip_norm"),
        ({"schedule": "cosine"}, "total_steps"),
        ({"schedule": "wsd", "total_steps": 5, "warmup_steps": 6}, "warmup_steps"),
        ({"betas": (0.9, 1.0)}, "betas"),
    ],
)
def test_bad_recipes_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValidationError, match=field):
        LocalOptimizer(**kwargs)


def test_no_weight_decay_on_biases_norms_and_embeddings():
    assert decays("fc.weight", (4, 3))
    assert not decays("fc.bias", (4,))
    assert not decays("ln.weight", (4,))
    assert not decays("tok_emb.weight", (50, 8))
