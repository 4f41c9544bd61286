"""The site engine's pieces that need no rank process: the batch split and its weights, the
recipe-to-torch.optim mapping (one step against ``SiteOptimizer``), the shared tensor file and
the settings each device resolves to."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from powertrip.config.recipe import LocalOptimizer
from powertrip.config.site_engine import SiteEngineConfig
from powertrip.learning.shards import shard_rows
from powertrip.learning.site_engine.files import TensorFile, layout_of
from powertrip.learning.site_engine.moments import (
    MomentFiles,
    export_moments,
    import_moments,
    moment_kinds,
)
from powertrip.learning.site_engine.optim import build_optimizer, round_lrs
from powertrip.learning.site_engine.split import check_rows, rank_share, split_shards
from powertrip.learning.site_optim import SiteOptimizer, SiteState


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("row", [[5, 1, 7, 2, 9], [5, 1, -1, -1, -1], [3, -1]])
def test_the_ranks_weights_sum_to_the_batch_mean(world, row):
    row = np.array(row)
    losses = np.arange(10, dtype=np.float64) + 1.0  # a per-sample loss for every row
    shares = [rank_share(row, world, r) for r in range(world)]
    assert len({len(idx) for idx, _ in shares}) == 1  # fixed shapes on every rank
    averaged = sum(float((losses[idx] * w).sum()) for idx, w in shares) / world  # DDP's average
    assert averaged == pytest.approx(losses[row[row >= 0]].mean(), rel=1e-6)
    picked = np.concatenate([idx[w > 0] for idx, w in shares])
    np.testing.assert_array_equal(picked, row[row >= 0])  # each real sample once, in order


def test_rows_are_checked_before_any_rank_sees_them():
    assert check_rows(np.array([[0, 1], [2, -1]], dtype=np.int32), 3).dtype == np.int64
    for bad, why in [
        (np.zeros((0, 2), int), "shape"),
        (np.array([[0, 3]]), r"\[0, 3\)"),
        (np.array([[0, -2]]), r"-1"),
        (np.array([[0, 1], [-1, -1]]), "step 1"),
        (np.array([[0.0, 1.0]]), "integer"),
    ]:
        with pytest.raises(ValueError, match=why):
            check_rows(bad, 3)


RECIPES = {
    "sgd": LocalOptimizer(name="sgd", lr=0.1, weight_decay=0.05, clip_norm=0.3),
    "momentum": LocalOptimizer(name="momentum", lr=0.1, momentum=0.8, weight_decay=0.05),
    "nesterov": LocalOptimizer(name="nesterov", lr=0.1, momentum=0.7, clip_norm=0.3),
    "adamw": LocalOptimizer(
        name="adamw",
        lr=0.01,
        weight_decay=0.1,
        schedule="cosine",
        warmup_steps=2,
        total_steps=6,
        min_lr_ratio=0.1,
        clip_norm=0.3,
    ),
}


@pytest.mark.parametrize("kind", list(RECIPES))
def test_torch_optim_from_the_recipe_steps_as_site_optimizer(kind):
    recipe = RECIPES[kind]
    g = torch.Generator().manual_seed(1)
    start = {
        "w": torch.randn(4, 3, generator=g),
        "b": torch.randn(3, generator=g),
        "tok_emb": torch.randn(5, 2, generator=g),
    }
    grads = [{n: torch.randn(t.shape, generator=g) for n, t in start.items()} for _ in range(5)]
    ref = SiteOptimizer(recipe, 1)
    rows = {n: t.clone().unsqueeze(0) for n, t in start.items()}
    params = {n: torch.nn.Parameter(t.clone()) for n, t in start.items()}
    opt = build_optimizer(recipe, params.items())
    for k, grad in enumerate(grads):
        ref.update(rows, {n: v.unsqueeze(0) for n, v in grad.items()}, 1)
        for group in opt.param_groups:
            group["lr"] = float(round_lrs(recipe, k, 1)[0])
        for n, p in params.items():
            p.grad = grad[n].clone()
        if recipe.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(list(params.values()), recipe.clip_norm)
        opt.step()
    for n, p in params.items():
        torch.testing.assert_close(p.detach(), rows[n][0], rtol=1e-6, atol=1e-6)


def test_weight_decay_only_where_decays_says_and_never_torchs_default():
    params = {
        "w": torch.nn.Parameter(torch.ones(2, 2)),
        "b": torch.nn.Parameter(torch.ones(2)),
        "tok_emb.weight": torch.nn.Parameter(torch.ones(3, 2)),
    }
    opt = build_optimizer(LocalOptimizer(name="adamw", lr=0.1), params.items())
    assert [g["weight_decay"] for g in opt.param_groups] == [0.0, 0.0]
    opt = build_optimizer(LocalOptimizer(name="sgd", lr=0.1, weight_decay=0.3), params.items())
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] for p in g["params"]}
    assert decayed == {id(params["w"])}


def test_nesterov_without_momentum_is_plain_sgd_not_torchs_error():
    opt = build_optimizer(
        LocalOptimizer(name="nesterov", lr=0.1, momentum=0.0),
        [("w", torch.nn.Parameter(torch.ones(2, 2)))],
    )
    assert opt.param_groups[0]["nesterov"] is False


def test_a_tensor_file_is_shared_by_every_mapping_of_it(tmp_path):
    layout = layout_of([("a", torch.zeros(3, 2)), ("s", torch.zeros(()))])
    writer = TensorFile(tmp_path / "f", layout, create=True)
    reader = TensorFile(tmp_path / "f", layout)
    writer.write({"a": torch.arange(6.0).view(3, 2), "s": torch.tensor(7.0)})
    assert torch.equal(reader["a"], torch.arange(6.0).view(3, 2)) and float(reader["s"]) == 7
    with pytest.raises(ValueError, match="shape"):
        writer.write({"a": torch.zeros(2, 3), "s": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="missing"):
        writer.write({"a": torch.zeros(3, 2)})


def test_shards_are_the_shard_rows_views_of_the_delta():
    delta = {"w": torch.arange(10.0).view(5, 2), "s": torch.tensor(3.0)}
    shards = split_shards(delta, 3)
    for i, shard in enumerate(shards):
        lo, hi = shard_rows(5, 3, i)
        assert torch.equal(shard["w"], delta["w"][lo:hi])
        assert ("s" in shard) == (i == 0)


def test_on_cuda_a_site_defaults_to_bf16_compile_and_nccl_on_the_cpu_to_fp32_eager_gloo():
    cfg = SiteEngineConfig()
    assert (
        cfg.resolved_precision("cuda"),
        cfg.resolved_compile("cuda"),
        cfg.resolved_backend("cuda"),
    ) == ("bf16", True, "nccl")
    assert (
        cfg.resolved_precision("cpu"),
        cfg.resolved_compile("cpu"),
        cfg.resolved_backend("cpu"),
    ) == ("fp32", False, "gloo")
    forced = SiteEngineConfig(precision="fp32", compile="off", backend="gloo")
    assert forced.resolved_precision("cuda") == "fp32" and not forced.resolved_compile("cuda")


def test_the_package_loads_torch_only_when_the_engine_is_used():
    import subprocess
    import sys

    code = (
        "import sys; from powertrip.learning.site_engine import SiteEngineConfig; "
        "SiteEngineConfig(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_torch_optimizer_moments_go_through_the_files_and_back(tmp_path):
    """Exported by two ranks' rows, loaded into a fresh optimizer: the next step is the same
    (AdamW's step count included); the files read back as a ``SiteState``."""
    recipe = LocalOptimizer(name="adamw", lr=0.01, weight_decay=0.1)
    assert moment_kinds(recipe) == ("exp_avg", "exp_avg_sq")
    assert moment_kinds(recipe.model_copy(update={"name": "sgd"})) == ()
    assert moment_kinds(recipe.model_copy(update={"keep_state": False})) == ()
    torch.manual_seed(0)
    params = {"w": torch.randn(5, 3, requires_grad=True), "b": torch.randn(3, requires_grad=True)}
    files = MomentFiles(tmp_path, layout_of(list(params.items())), moment_kinds(recipe), True)
    opt = build_optimizer(recipe, params.items())
    grads = [{n: torch.randn_like(p) for n, p in params.items()} for _ in range(3)]

    def step(o, g):
        for n, p in params.items():
            p.grad = g[n]
        o.step()

    for g in grads[:2]:
        step(opt, g)
    for rank in range(2):  # each rank its rows, as DDP ranks write the update
        rows = lambda p, r=rank: slice(*shard_rows(p.shape[0], 2, r))  # noqa: E731
        assert export_moments(opt, params, files, rows, fsdp=False) == 2
    state = files.state(step=7, moment_step=2)
    assert state.moment_step == 2 and set(state.moments["w"]) == {"exp_avg", "exp_avg_sq"}
    torch.testing.assert_close(state.moments["w"]["exp_avg"], opt.state[params["w"]]["exp_avg"])

    saved = {n: p.detach().clone() for n, p in params.items()}
    fresh = build_optimizer(recipe, params.items())
    import_moments(fresh, params, files, None, fsdp=False, step=2, fused=False)
    step(opt, grads[2])
    want = {n: p.detach().clone() for n, p in params.items()}
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(saved[n])
    step(fresh, grads[2])
    for n, p in params.items():
        torch.testing.assert_close(p.detach(), want[n], rtol=0, atol=0)
    assert files.write(SiteState(7, {"w": {"exp_avg": torch.ones(5, 3)}})) == 7
    assert float(files.files["exp_avg_sq"]["w"].abs().sum()) == 0  # a missing kind: zero
    with pytest.raises(ValueError, match="not the model"):
        files.write(SiteState(7, {"w": {"exp_avg": torch.ones(3)}}))
