"""A one-rank site engine (torch.optim over a real process group) gives the update of the
reference per-site loop (``train_sites_in_turn``: ``SiteOptimizer``) for every recipe kind,
over two rounds: kept moments resume, ``keep_state=False`` and ``state_reset`` start them
afresh while the schedule keeps the site's cumulative step. Also the bf16 autocast path on the
CPU, and a round past its deadline."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.batches import LocalTrainingConfig
from powertrip.learning.engines import EngineSpec, LocalRound, build_engine, train_sites_in_turn
from powertrip.learning.gpt import GPT, GPTShape
from powertrip.learning.site_engine import RankEngine, RankFailed, SiteEngineConfig, SiteGroup
from powertrip.learning.site_optim import SiteState
from powertrip.learning.trainer import get_params

VOCAB, SHAPE, N = 20, GPTShape(n_layer=2, n_head=2, d_model=32, context_length=16), 44
FACTORY = functools.partial(GPT, VOCAB, SHAPE, fused_attention=True)
RECIPES = {
    "sgd": LocalOptimizer(
        name="sgd",
        lr=0.2,
        weight_decay=0.01,
        schedule="wsd",
        warmup_steps=2,
        total_steps=20,
        decay_fraction=0.5,
        clip_norm=1.0,
    ),
    # keep_state=False: fresh momentum every round, the cosine on the cumulative step
    "momentum": LocalOptimizer(
        name="momentum",
        lr=0.05,
        momentum=0.9,
        weight_decay=0.01,
        schedule="cosine",
        total_steps=20,
        keep_state=False,
    ),
    "nesterov": LocalOptimizer(name="nesterov", lr=0.05, momentum=0.8, clip_norm=0.5),
    # eps 1e-5: see test_site_engine.py (AdamW amplifies rounding on ~0 gradients)
    "adamw": LocalOptimizer(
        name="adamw",
        lr=0.01,
        eps=1e-5,
        weight_decay=0.1,
        schedule="cosine",
        warmup_steps=2,
        total_steps=20,
        min_lr_ratio=0.1,
        clip_norm=0.5,
    ),
}


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (N, SHAPE.context_length), generator=g)
    return x, torch.roll(x, -1, 1)


def schedule(seed: int, batch: int = 8) -> np.ndarray:
    rows = np.full(-(-N // batch) * batch, -1)
    rows[:N] = np.random.default_rng(seed).permutation(N)
    return rows.reshape(-1, batch)  # 6 steps, the last with 4 samples


def start_params() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return get_params(GPT(VOCAB, SHAPE))


def reference(recipe, params, rows, state):
    x, y = data()
    out = train_sites_in_turn(
        GPT(VOCAB, SHAPE),
        params,
        x,
        y,
        [np.arange(N)],
        [rows],
        recipe,
        torch.device("cpu"),
        [state],
    )
    delta = {n: d[0] for n, d in out.deltas.items()}
    return delta, float(out.loss[0]), (out.opt_state or [SiteState(0, {})])[0]


def assert_same_update(got: dict, want: dict, tol: float = 1e-5) -> None:
    for name in want:
        torch.testing.assert_close(
            got[name], want[name], rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.fixture(scope="module")
def groups():
    made: dict[str, SiteGroup] = {}

    def get(kind: str, **cfg) -> SiteGroup:
        if kind not in made:
            x, y = data()
            made[kind] = SiteGroup(
                FACTORY,
                x,
                y,
                RECIPES[kind.split("-")[0]],
                SiteEngineConfig(**cfg),
                device="cpu",
                threads=1,
            )
        return made[kind]

    yield get
    for g in made.values():
        g.close()


@pytest.mark.parametrize("kind", list(RECIPES))
def test_one_rank_equals_the_per_site_loop_over_two_rounds(groups, kind):
    recipe, group = RECIPES[kind], groups(kind)
    g0, rows1, rows2 = start_params(), schedule(1), schedule(2)
    got1 = group.train_round(g0, rows1)
    want1, loss1, state = reference(recipe, g0, rows1, None)
    assert_same_update(got1.delta, want1)
    assert got1.loss == pytest.approx(loss1, rel=1e-5)

    g1 = {n: p + 0.5 * want1[n] for n, p in g0.items()}  # the next round's global model
    got2 = group.train_round(g1, rows2)
    want2, loss2, _ = reference(recipe, g1, rows2, state.for_round(recipe))
    assert_same_update(got2.delta, want2)
    assert got2.loss == pytest.approx(loss2, rel=1e-5)
    assert (got2.first_step, got2.fresh_state) == (6, not recipe.keep_state)
    assert group.step == 12


def test_the_rank_engine_trains_through_the_local_engine_interface_as_in_turn_does(groups):
    """The same rounds to the rank engine and to the in-turn engine: the same updates, losses,
    step counts and moments, resuming from nothing, from the state handed back (kept in the
    ranks) and from another state (loaded into them: the same step, moments afresh)."""
    recipe = RECIPES["adamw"]
    cfg = LocalTrainingConfig(lr=0.01, batch_size=8, optimizer=recipe)
    ranks = RankEngine(groups("adamw-engine"), cfg)  # a group of its own, at step 0
    in_turn = build_engine("in-turn", EngineSpec(GPT(VOCAB, SHAPE), cfg, torch.device("cpu")))
    x, y = data()
    params, mine, theirs = start_params(), None, None
    for rnd, seed in enumerate((1, 2, 3)):
        if rnd == 2:  # a state not handed out by the engine: loaded, not assumed
            mine, theirs = mine.fresh_moments(), theirs.fresh_moments()
        got = ranks.train(LocalRound(params, x, y, [np.arange(N)], [seed], [mine]))
        want = in_turn.train(LocalRound(params, x, y, [np.arange(N)], [seed], [theirs]))
        first = {n: d[0] for n, d in want.deltas.items()}
        assert_same_update({n: d[0] for n, d in got.deltas.items()}, first)
        assert got.loss[0] == pytest.approx(want.loss[0], rel=1e-5)
        assert list(got.steps) == list(want.steps) == [6]
        (mine,), (theirs,) = got.opt_state, want.opt_state
        assert mine.step == theirs.step == 6 * (rnd + 1)
        params = {n: p + 0.5 * first[n] for n, p in params.items()}
    assert ranks.last is not None and len(ranks.last.shards) == 1


@pytest.mark.parametrize("kind", ["adamw", "nesterov", "momentum"])
def test_the_groups_site_state_is_the_per_site_loops(groups, kind):
    """``site_state``: ``SiteOptimizer``'s kinds, shapes and values (none for momentum with
    ``keep_state=False``, whose moments never outlive a round)."""
    recipe, group = RECIPES[kind], groups(kind)
    g0, rows = start_params(), schedule(1)
    group.train_round(g0, rows, state_reset=True, first_step=0)
    got, (_, _, want) = group.site_state, reference(recipe, g0, rows, None)
    assert got.step == want.step == rows.shape[0]
    if not recipe.keep_state:
        assert got.moments == {}
        return
    assert got.moment_step == want.moment_step
    assert {n: set(m) for n, m in got.moments.items()} == {
        n: set(m) for n, m in want.moments.items()
    }
    for name, kinds in want.moments.items():
        for k, t in kinds.items():
            torch.testing.assert_close(got.moments[name][k], t, rtol=1e-5, atol=1e-7)


def test_state_reset_drops_the_moments_but_not_the_schedules_position(groups):
    recipe, group = RECIPES["adamw"], groups("adamw")
    g0, rows = start_params(), schedule(3)
    if group.step == 0:
        group.train_round(g0, schedule(1))
    step = group.step
    got = group.train_round(g0, rows, state_reset=True)
    want, _, _ = reference(recipe, g0, rows, SiteState(step, {}, 0))
    assert got.fresh_state and got.first_step == step
    assert_same_update(got.delta, want)


def test_bf16_autocast_trains_on_the_cpu_close_to_fp32(groups):
    group = groups("sgd-bf16", precision="bf16")
    g0, rows = start_params(), schedule(1)
    got = group.train_round(g0, rows)
    want, loss, _ = reference(RECIPES["sgd"], g0, rows, None)
    flat = torch.cat([got.delta[n].flatten() for n in want])
    ref = torch.cat([want[n].flatten() for n in want])
    assert got.delta["tok.weight"].dtype == torch.float32 and bool(flat.isfinite().all())
    assert float((flat - ref).norm() / ref.norm()) < 0.05  # bf16 matmuls, fp32 everything else
    assert got.loss == pytest.approx(loss, rel=0.02)


def test_a_round_past_its_deadline_fails_and_the_next_one_starts_fresh_ranks(groups):
    group = groups("nesterov")
    g0, rows = start_params(), schedule(1)
    group.train_round(g0, rows[:1])  # the rank is up
    with pytest.raises(RankFailed, match="the ranks missed the round.s deadline during round"):
        group.train_round(g0, np.concatenate([rows] * 500), deadline_s=0.2)
    assert not group.running
    resumed = group.train_round(g0, rows[:2])  # fresh ranks, the site's momentum loaded
    assert not resumed.fresh_state and group.running


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_default_site_trains_bf16_compiled_over_nccl_close_to_fp32():
    x, y = data()
    g0, rows = start_params(), schedule(1)
    cfg = SiteEngineConfig()  # auto: bf16, torch.compile, nccl, fused SGD
    with SiteGroup(FACTORY, x, y, RECIPES["sgd"], cfg, device="cuda") as group:
        got = group.train_round(g0, rows)
        again = group.train_round(g0, rows)  # compiled once, reused
    want, loss, _ = reference(RECIPES["sgd"], g0, rows, None)
    flat = torch.cat([got.delta[n].flatten() for n in want])
    ref = torch.cat([want[n].flatten() for n in want])
    assert flat.device.type == "cpu" and bool(flat.isfinite().all())
    assert float((flat - ref).norm() / ref.norm()) < 0.05
    assert got.loss == pytest.approx(loss, rel=0.02) and again.steps == rows.shape[0]
