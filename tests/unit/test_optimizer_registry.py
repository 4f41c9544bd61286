"""The optimizer registry is open: a recipe's name is any registered rule, the names are read
without torch, and a user's own rule (here Adagrad, registered in this file and nowhere else)
trains in the stacked engines and the rank engine alike and keeps its state like a built-in."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence

import pytest
import torch
from pydantic import ValidationError

from powertrip.config import optimizers
from powertrip.config.recipe import LocalOptimizer
from powertrip.learning import site_state_io
from powertrip.learning.optimizers import (
    MomentKind,
    OptimizerRule,
    RowStep,
    moment_kinds,
    optimizer_names,
    register_optimizer,
    rule_for,
)
from powertrip.learning.optimizers.base import MOMENTS, per_row, resolved_lr
from powertrip.learning.optimizers.sgd import SGD
from powertrip.learning.site_engine.files import layout_of
from powertrip.learning.site_engine.moments import MomentFiles, export_moments, import_moments
from powertrip.learning.site_engine.moments import moment_kinds as kept_kinds
from powertrip.learning.site_engine.optim import build_optimizer
from powertrip.learning.site_optim import SiteOptimizer

SUM = MomentKind("sum", "sum", nonnegative=True, counted=True)
EPS = 1e-10


class Adagrad(OptimizerRule):
    """torch's Adagrad (no lr decay, no weight decay): a user's rule, in a dozen lines."""

    kinds = (SUM,)

    def update(
        self, step: RowStep, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]
    ) -> None:
        for name, g in grads.items():
            acc = step.moments(name)["sum"]
            acc.addcmul_(g, g, value=1)
            params[name].addcdiv_(g * per_row(-step.lr, g), acc.sqrt().add_(EPS))

    def torch_optimizer(
        self, recipe: LocalOptimizer, named: Sequence[tuple[str, torch.Tensor]], fused: bool
    ) -> torch.optim.Optimizer:
        group = {"params": [p for _, p in named], MOMENTS: ("sum",)}
        return torch.optim.Adagrad([group], lr=resolved_lr(recipe), eps=EPS)


SHAPES = {"fc.weight": (4, 3), "fc.bias": (4,)}


@pytest.fixture
def registry(monkeypatch):
    """The registry as it is, restored after the test."""
    monkeypatch.setattr(optimizers, "_ENTRIES", dict(optimizers._ENTRIES))


def _stacked(rows: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(rows, *s, generator=g) for n, s in SHAPES.items()}


def test_the_names_are_read_and_checked_without_torch():
    code = (
        "import sys; from powertrip.config.recipe import LocalOptimizer; "
        "from powertrip.config.optimizers import optimizer_names; "
        "LocalOptimizer(name='adamw'); print(','.join(optimizer_names()), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [",".join(optimizer_names()), "False"]
    assert optimizer_names()[:4] == ("sgd", "momentum", "nesterov", "adamw")


def test_an_unknown_name_is_refused_listing_the_registered_ones():
    with pytest.raises(ValidationError, match="name") as err:
        LocalOptimizer(name="lion")
    registered = ", ".join(optimizer_names())
    assert f"unknown optimizer 'lion'; registered: {registered}" in str(err.value)


def test_a_users_rule_trains_stacked_rows_as_torch_does_on_each_site_alone(registry):
    register_optimizer("adagrad", Adagrad(), adaptive_lr=True)
    recipe = LocalOptimizer(name="adagrad", lr=0.1)
    assert "adagrad" in optimizer_names() and recipe.carries_over and not recipe.plain_sgd
    schema = LocalOptimizer.model_json_schema()["properties"]["name"]
    assert "adagrad" in schema["enum"]  # the help and schema show it as a choice
    rows, active = 2, [2, 2, 1]
    params, grads = _stacked(rows, 0), [_stacked(rows, 10 + s) for s in range(3)]
    start = {n: t.clone() for n, t in params.items()}
    opt = SiteOptimizer(recipe, rows)
    for s, a in enumerate(active):
        opt.update(params, grads[s], a)
    for r in range(rows):
        alone = {n: t[r].clone().requires_grad_(True) for n, t in start.items()}
        torch_opt = build_optimizer(recipe, list(alone.items()))
        for s in range(sum(a > r for a in active)):
            for n, p in alone.items():
                p.grad = grads[s][n][r].clone()
            torch_opt.step()
        for n in SHAPES:
            torch.testing.assert_close(params[n][r], alone[n].detach(), rtol=1e-6, atol=1e-7)


def test_a_users_rule_keeps_its_state_in_the_workers_file_and_the_rank_engines(registry, tmp_path):
    register_optimizer("adagrad", Adagrad())
    recipe = LocalOptimizer(name="adagrad", lr=0.1)
    assert "sum" in moment_kinds() and kept_kinds(recipe) == ("sum",)
    params = _stacked(1, 0)
    opt = SiteOptimizer(recipe, 1)
    opt.update(params, _stacked(1, 1), 1)
    path = tmp_path / "site-states.pt"
    site_state_io.save_site_states(path, {0: opt.export([0])[0]}, "run", 0)
    loaded = site_state_io.load_site_states(path, "run", SHAPES, [0])
    assert loaded.trusted and torch.equal(
        loaded.states[0].moments["fc.weight"]["sum"], opt.export([0])[0].moments["fc.weight"]["sum"]
    )
    named = {n: t[0].clone().requires_grad_(True) for n, t in params.items()}
    files = MomentFiles(tmp_path, layout_of(list(named.items())), kept_kinds(recipe), True)
    torch_opt = build_optimizer(recipe, named.items())
    for p in named.values():
        p.grad = torch.ones_like(p)
    torch_opt.step()
    assert export_moments(torch_opt, named, files, lambda p: slice(None), fsdp=False) == 1
    fresh = build_optimizer(recipe, named.items())
    import_moments(fresh, named, files, lambda p: slice(None), fsdp=False, step=1, fused=False)
    assert set(fresh.state[named["fc.weight"]]) == {"sum", "step"}
    assert torch.equal(fresh.state[named["fc.bias"]]["sum"], torch.ones(4))


def test_a_rule_named_as_module_attr_is_imported_when_first_used(registry):
    register_optimizer("plain2", "powertrip.learning.optimizers.sgd:SGD", moments=False)
    assert rule_for("plain2") is SGD and not LocalOptimizer(name="plain2").carries_over
    register_optimizer("typo", "powertrip.learning.optimizers.sgd:SDG")  # checked on use
    with pytest.raises(AttributeError, match="SDG"):
        rule_for("typo")
    register_optimizer("not_a_rule", object())
    with pytest.raises(TypeError, match="not an OptimizerRule"):
        rule_for("not_a_rule")


def test_a_taken_name_or_a_bad_target_is_refused(registry):
    with pytest.raises(ValueError, match="'adamw' is already registered"):
        register_optimizer("adamw", Adagrad())
    register_optimizer("adamw", Adagrad(), replace=True)
    assert isinstance(rule_for("adamw"), Adagrad)
    with pytest.raises(ValueError, match="must be 'module:attr'"):
        register_optimizer("lion", "my_package.lion")
    with pytest.raises(ValueError, match="Python identifier"):
        register_optimizer("my lion", Adagrad())


def test_one_kind_name_means_one_thing_across_rules(registry):
    class Other(Adagrad):
        kinds = (MomentKind("momentum", "velocity"),)  # the SGD family's kind, another key

    register_optimizer("other", Other())
    with pytest.raises(ValueError, match="defines moment 'momentum' unlike another rule"):
        moment_kinds()


def test_a_recipe_dumped_with_a_registered_name_reads_back():
    recipe = LocalOptimizer(name="nesterov", lr=2e-3)
    assert LocalOptimizer.model_validate(json.loads(recipe.model_dump_json())) == recipe
