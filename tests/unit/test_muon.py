"""Muon (the curtailment paper's recipe, as in nanochat) through the optimizer registry: Muon on
the hidden matrices, AdamW on the rest; its batched update over stacked sites is what
``torch.optim.Muon`` beside torch's AdamW gives on each site alone, its state survives every
keeper's format, and a short LM run with it trains, in the emulator and in the rank engine."""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

import powertrip as pt
from powertrip.config.recipe import LocalOptimizer
from powertrip.learning import site_state_io
from powertrip.learning.engines import train_sites_in_turn
from powertrip.learning.gpt import GPT, GPTShape
from powertrip.learning.models import build_model
from powertrip.learning.optimizers.muon import hidden_matrices, orthogonalise
from powertrip.learning.site_engine import SiteEngineConfig, SiteGroup
from powertrip.learning.site_engine.files import layout_of
from powertrip.learning.site_engine.moments import (
    MomentFiles,
    export_moments,
    import_moments,
    moment_kinds,
)
from powertrip.learning.site_engine.optim import build_optimizer, round_lrs
from powertrip.learning.site_optim import SiteOptimizer
from powertrip.learning.trainer import get_params

#: a GPT-like model: an embedding (tied head), a tall and a wide block matrix, a bias, a gain
SHAPES = {
    "tok.weight": (11, 8),
    "blocks.0.fc.weight": (16, 8),
    "blocks.0.fc.bias": (16,),
    "blocks.0.out.weight": (8, 16),
    "ln_f.weight": (8,),
}
MATRICES = {"blocks.0.fc.weight", "blocks.0.out.weight"}
MUON = LocalOptimizer(
    name="muon",
    lr=0.01,
    weight_decay=0.1,
    schedule="cosine",
    warmup_steps=1,
    total_steps=6,
    clip_norm=2.0,
)


def _stacked(rows: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(rows, *s, generator=g) for n, s in SHAPES.items()}


def _names(model: nn.Module) -> set[str]:
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    return set(hidden_matrices(shapes))


def test_the_hidden_matrices_are_the_gpts_block_matrices_and_no_embedding_head_or_conv():
    gpt = GPT(64, GPTShape(n_layer=2, n_head=2, d_model=16, context_length=8))
    blocks = {f"blocks.{i}.{m}.weight" for i in range(2) for m in ("qkv", "proj", "fc", "out")}
    assert _names(gpt) == blocks  # tok/pos (tok is the tied head), biases, norms: AdamW
    assert _names(build_model("cnn1d", 10, (1, 40))) == set()  # 3-D convs, the head
    assert _names(build_model("cnn2d", 10, (1, 28, 28))) == {"fc1.weight"}  # fc2: the head
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    assert _names(mlp) == {"0.weight", "2.weight"}  # its last Linear is its output layer
    assert _names(build_model("lstm", 80, (20,))) == {
        "input_proj.0.weight",
        "input_proj.1.weight",
        "hidden_proj.0.weight",
        "hidden_proj.1.weight",
    }


def test_newton_schulz_orthogonalises_each_sites_matrix_on_its_own():
    g = torch.randn(3, 16, 8) * torch.logspace(0, 2, 8)  # singular values 100x apart
    o = orthogonalise(g).float()
    assert o.dtype == torch.float32 and o.shape == g.shape
    sv = torch.linalg.svdvals(o)
    assert float(sv.min()) > 0.5 and float(sv.max()) < 1.5  # ~1 whatever the spread was
    for row in range(3):  # a batched matmul mixes no sites
        assert torch.equal(orthogonalise(g[row : row + 1])[0], orthogonalise(g)[row])


def test_stacked_rows_equal_torch_muon_and_adamw_on_each_site_alone():
    """Sites finish after 4, 3 and 2 steps; each is compared with the rank engine's torch
    optimizer (``torch.optim.Muon`` + ``AdamW``) driven as the rank engine drives it."""
    rows, active = 3, [3, 3, 2, 1]
    params, grads = _stacked(rows, 0), [_stacked(rows, 100 + s) for s in range(len(active))]
    start = {n: t.clone() for n, t in params.items()}
    opt = SiteOptimizer(MUON, rows)
    for s, a in enumerate(active):
        opt.update(params, grads[s], a)
    for r in range(rows):
        alone = {n: t[r].clone().requires_grad_(True) for n, t in start.items()}
        torch_opt = build_optimizer(MUON, list(alone.items()))
        assert {type(o).__name__ for o in torch_opt.parts} == {"Muon", "AdamW"}
        steps = sum(a > r for a in active)
        for s, lr in enumerate(round_lrs(MUON, 0, steps)):
            for group in torch_opt.param_groups:
                group["lr"] = float(lr)
            for n, p in alone.items():
                p.grad = grads[s][n][r].clone()
            torch.nn.utils.clip_grad_norm_(list(alone.values()), MUON.clip_norm)
            torch_opt.step()
        for n in SHAPES:
            torch.testing.assert_close(params[n][r], alone[n].detach(), rtol=1e-5, atol=1e-6)
            assert not torch.equal(params[n][r], start[n][r])
    kinds = {n: set(m) for n, m in opt.export([0])[0].moments.items()}
    assert kinds == {
        n: {"momentum"} if n in MATRICES else {"exp_avg", "exp_avg_sq"} for n in SHAPES
    }


def test_a_state_saved_to_the_workers_file_resumes_bit_identically(tmp_path):
    params, grads = _stacked(2, 0), [_stacked(2, 100 + s) for s in range(4)]
    straight = {n: t.clone() for n, t in params.items()}
    opt = SiteOptimizer(MUON, 2)
    for g in grads:
        opt.update(straight, g, 2)
    first = SiteOptimizer(MUON, 2)
    for g in grads[:2]:
        first.update(params, g, 2)
    path = tmp_path / "site-states.pt"
    site_state_io.save_site_states(path, dict(enumerate(first.export([0, 1]))), "run", 0)
    loaded = site_state_io.load_site_states(path, "run", SHAPES, [0, 1])
    assert loaded.trusted and sorted(loaded.states) == [0, 1]
    second = SiteOptimizer(MUON, 2)
    second.load([loaded.states[0], loaded.states[1]], params)
    for g in grads[2:]:
        second.update(params, g, 2)
    for n in SHAPES:
        assert torch.equal(params[n], straight[n])


def test_the_rank_engines_moments_go_through_its_files_and_back(tmp_path):
    torch.manual_seed(0)
    params = {n: torch.randn(*s, requires_grad=True) for n, s in SHAPES.items()}
    assert moment_kinds(MUON) == ("momentum", "exp_avg", "exp_avg_sq")
    files = MomentFiles(tmp_path, layout_of(list(params.items())), moment_kinds(MUON), True)
    opt = build_optimizer(MUON, params.items())
    grads = [{n: torch.randn_like(p) for n, p in params.items()} for _ in range(3)]

    def step(o: torch.optim.Optimizer, g: dict) -> None:
        for n, p in params.items():
            p.grad = g[n]
        o.step()

    for g in grads[:2]:
        step(opt, g)
    assert export_moments(opt, params, files, lambda p: slice(None), fsdp=False) == 2
    state = files.state(step=2, moment_step=2)
    buf = opt.state[params["blocks.0.fc.weight"]]["momentum_buffer"]
    torch.testing.assert_close(state.moments["blocks.0.fc.weight"]["momentum"], buf)
    saved = {n: p.detach().clone() for n, p in params.items()}
    fresh = build_optimizer(MUON, params.items())
    import_moments(fresh, params, files, lambda p: slice(None), fsdp=False, step=2, fused=False)
    assert set(fresh.state[params["blocks.0.fc.weight"]]) == {"momentum_buffer"}  # no Adam's
    step(opt, grads[2])
    want = {n: p.detach().clone() for n, p in params.items()}
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(saved[n])
    step(fresh, grads[2])
    for n, p in params.items():
        assert torch.equal(p.detach(), want[n])


def test_a_short_lm_run_with_muon_trains_in_the_emulator():
    cfg = pt.build_config(
        None,
        workload="lm",
        num_sites=2,
        num_samples=256,
        n_layer=1,
        n_head=2,
        d_model=32,
        context_length=16,
        static_sweep=(2,),
        policies=("static-optimal",),
        max_rounds=3,
        local_optimizer={"name": "muon", "lr": 2e-3},
    )
    losses: list[float] = []
    pt.run_study(cfg, on_round=lambda policy, repeat, record: losses.append(record.loss))
    assert len(losses) == 3 and all(np.isfinite(losses))
    assert losses[-1] < losses[0] - 0.5  # nats, over two rounds of local steps


LM_SHAPE = GPTShape(n_layer=1, n_head=2, d_model=16, context_length=8)
LM_VOCAB, LM_N = 20, 24


def test_the_rank_engine_trains_muon_as_the_per_site_loop_over_two_rounds():
    """One rank (torch.optim.Muon + AdamW over a process group) against ``SiteOptimizer`` in
    the one-site loop: the same update, and the kept moments resume in the second round."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, LM_VOCAB, (LM_N, LM_SHAPE.context_length), generator=g)
    y = torch.roll(x, -1, 1)
    factory = functools.partial(GPT, LM_VOCAB, LM_SHAPE, fused_attention=True)
    # eps 1e-5: AdamW's part amplifies rounding on ~0 gradients (as in test_site_engine.py)
    recipe = MUON.model_copy(update={"total_steps": 12, "eps": 1e-5})
    rows = [np.random.default_rng(k).permutation(LM_N).reshape(-1, 8) for k in (1, 2)]
    torch.manual_seed(0)
    start = get_params(factory())
    with SiteGroup(factory, x, y, recipe, SiteEngineConfig(), device="cpu", threads=1) as group:
        got1 = group.train_round(start, rows[0])
        nxt = {n: p + got1.delta[n] for n, p in start.items()}
        got2 = group.train_round(nxt, rows[1])
    want1 = train_sites_in_turn(
        factory(), start, x, y, [np.arange(LM_N)], [rows[0]], recipe, torch.device("cpu"), [None]
    )
    state = want1.opt_state[0]
    want2 = train_sites_in_turn(
        factory(), nxt, x, y, [np.arange(LM_N)], [rows[1]], recipe, torch.device("cpu"), [state]
    )
    for got, want in ((got1, want1), (got2, want2)):
        for n, d in want.deltas.items():
            torch.testing.assert_close(got.delta[n], d[0], rtol=1e-4, atol=1e-5)
