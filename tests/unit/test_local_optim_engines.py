"""Every training engine applies the local optimizer recipe through the same seam: vmap,
the stacked chain and one site at a time each give what torch's optimizer gives on each site
alone, and a site handed its state back resumes where it stopped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from powertrip.config.recipe import LocalOptimizer, decays
from powertrip.learning.batches import site_schedule
from powertrip.learning.engines import train_sites_in_turn
from powertrip.learning.lr_schedule import lr_factors
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params

ADAMW = LocalOptimizer(
    name="adamw",
    lr=0.02,
    weight_decay=0.1,
    schedule="cosine",
    warmup_steps=2,
    total_steps=12,
    min_lr_ratio=0.1,
    clip_norm=0.5,
)
SITES = [np.arange(0, 10), np.arange(10, 37), np.arange(40, 47)]  # 3, 7 and 2 steps
SEEDS = [11, 12, 13]


def _problem():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(90, 1, 8, generator=g)
    return x, (x.sum(dim=(1, 2)) > 0).long()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 2))


def _alone(start: dict, x, y, idx, sched_rounds, recipe: LocalOptimizer) -> dict:
    """One site with torch.optim.AdamW + LambdaLR + clip_grad_norm_, over its rounds' batches,
    restarting from ``start`` each round but keeping the optimizer (keep_state=True)."""
    m = _model()
    ps = dict(m.named_parameters())
    groups = [
        {"params": [p for n, p in ps.items() if decays(n, tuple(p.shape))]},
        {"params": [p for n, p in ps.items() if not decays(n, tuple(p.shape))], "weight_decay": 0},
    ]
    opt = torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: float(lr_factors(np.array([k]), "cosine", 2, 12, 0.1)[0])
    )
    for rnd in sched_rounds:
        with torch.no_grad():
            for n, p in ps.items():
                p.copy_(start[n])
        for step in rnd:
            rows = idx[step[step >= 0]]
            opt.zero_grad()
            nn.functional.cross_entropy(m(x[rows]), y[rows]).backward()
            torch.nn.utils.clip_grad_norm_(list(ps.values()), recipe.clip_norm)
            opt.step()
            sched.step()
    return {n: p.detach() - start[n] for n, p in ps.items()}


@pytest.mark.parametrize("engine", ["stacked", "vmap", "in-turn"])
def test_adamw_with_schedule_and_clipping_matches_torch_per_site_over_two_rounds(engine):
    x, y = _problem()
    model = _model()
    cfg = LocalTrainingConfig(lr=0.3, batch_size=4, optimizer=ADAMW)
    start = get_params(model)
    if engine == "in-turn":

        def train(seeds, states):
            scheds = [site_schedule(cfg, len(i), s) for i, s in zip(SITES, seeds, strict=True)]
            return train_sites_in_turn(
                model, start, x, y, SITES, scheds, cfg.recipe, torch.device("cpu"), states
            )
    else:
        trainer = SiteTrainer(model, cfg, device="cpu", engine=engine)

        def train(seeds, states):
            return trainer.train(start, x, y, SITES, seeds, states)

    first = train(SEEDS, None)
    assert [s.step for s in first.opt_state] == [3, 7, 2]
    # round two: the sites come back in the same order with their own state
    second = train([s + 100 for s in SEEDS], first.opt_state)
    assert [s.step for s in second.opt_state] == [6, 14, 4]
    for j, idx in enumerate(SITES):
        rounds = [site_schedule(cfg, len(idx), s) for s in (SEEDS[j], SEEDS[j] + 100)]
        want = _alone(start, x, y, idx, rounds, ADAMW)
        for name in want:
            torch.testing.assert_close(second.deltas[name][j], want[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("engine", ["stacked", "vmap"])
def test_a_reset_recipe_rebuilds_adamw_each_round_on_the_schedule_of_cumulative_steps(engine):
    """keep_state=False: torch's AdamW built afresh every round (the curtailment paper's
    inner optimizer), its lr still read from the site's cumulative step count."""
    x, y = _problem()
    model = _model()
    reset = ADAMW.model_copy(update={"keep_state": False})
    cfg = LocalTrainingConfig(lr=0.3, batch_size=4, optimizer=reset)
    start = get_params(model)
    trainer = SiteTrainer(model, cfg, device="cpu", engine=engine)
    first = trainer.train(start, x, y, SITES, SEEDS)
    second = trainer.train(
        start,
        x,
        y,
        SITES,
        [s + 100 for s in SEEDS],
        [st.for_round(reset) for st in first.opt_state],
    )
    assert [(s.step, s.moment_step) for s in second.opt_state] == [(6, 3), (14, 7), (4, 2)]
    for j, idx in enumerate(SITES):
        m = _model()
        ps = dict(m.named_parameters())
        done = 0
        for seed in (SEEDS[j], SEEDS[j] + 100):
            with torch.no_grad():
                for n, p in ps.items():
                    p.copy_(start[n])
            groups = [
                {"params": [p for n, p in ps.items() if decays(n, tuple(p.shape))]},
                {
                    "params": [p for n, p in ps.items() if not decays(n, tuple(p.shape))],
                    "weight_decay": 0,
                },
            ]
            opt = torch.optim.AdamW(groups, lr=reset.lr, betas=reset.betas, weight_decay=0.1)
            for step in site_schedule(cfg, len(idx), seed):
                factor = lr_factors(np.array([done]), "cosine", 2, 12, 0.1)[0]
                for g in opt.param_groups:
                    g["lr"] = reset.lr * float(factor)
                rows = idx[step[step >= 0]]
                opt.zero_grad()
                nn.functional.cross_entropy(m(x[rows]), y[rows]).backward()
                torch.nn.utils.clip_grad_norm_(list(ps.values()), reset.clip_norm)
                opt.step()
                done += 1
        for name, p in ps.items():
            want = p.detach() - start[name]
            torch.testing.assert_close(second.deltas[name][j], want, rtol=1e-4, atol=1e-5)


def test_plain_sgd_default_keeps_no_state_and_the_old_update():
    x, y = _problem()
    model = _model()
    plain = SiteTrainer(model, LocalTrainingConfig(lr=0.3, batch_size=4), device="cpu")
    upd = plain.train(get_params(model), x, y, SITES, SEEDS)
    assert upd.opt_state is None
    explicit = LocalTrainingConfig(lr=0.3, batch_size=4, optimizer=LocalOptimizer(name="sgd"))
    same = SiteTrainer(model, explicit, device="cpu").train(get_params(model), x, y, SITES, SEEDS)
    for name, d in upd.deltas.items():
        assert torch.equal(same.deltas[name], d)
