"""A workload the user brings sets its own loss (per sample, used by the batched trainer, the
per-site loop and evaluation) or its own local step (sites then train one at a time, and what
the step made of the weights is what FedAvg averages); a loss or step that cannot work is
refused with a message naming the workload."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import powertrip as pt
from powertrip.aggregation.robust import Aggregation
from powertrip.config.sites import RoundTimeModel
from powertrip.federation import build_federation, load_workload, site_model_factory
from powertrip.learning.engines import train_sites_in_turn
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params
from powertrip.rounds.emulate import Emulator, TimeModel, TrajectoryCache
from powertrip.selection.base import SelectAll
from powertrip.sites.profiles import ModelledLinks, StaticPower, generate_sites
from tests.workloads import blobs, halves, normalised_mlp, plain_mlp

LR, BATCH = 0.2, 8
SITES = [np.arange(0, 40), np.arange(40, 53), np.arange(53, 120)]  # uneven: padded steps
SEEDS = [1, 2, 3]


def one_hot_mse(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Squared error of the softmax against the one-hot label, one value per sample (``scatter``,
    not ``one_hot``, which reads the labels' values and so cannot run under vmap)."""
    target = torch.zeros_like(logits).scatter(-1, y.unsqueeze(-1), 1.0)
    return ((logits.softmax(-1) - target) ** 2).sum(-1)


def _reference(model: nn.Module, state, x, y, trainer: SiteTrainer, loss_fn) -> list[dict]:
    """A hand-written local loop: each site's batches, mean loss over real rows, p -= lr * g."""
    deltas = []
    for idx, seed in zip(SITES, SEEDS, strict=True):
        params = {n: v.clone().requires_grad_(True) for n, v in state.items()}
        for step in trainer._site_schedule(len(idx), seed):
            pick = torch.as_tensor(idx[step[step >= 0]])
            out = torch.func.functional_call(model, params, (x[pick],))
            grads = torch.autograd.grad(loss_fn(out, y[pick]).mean(), list(params.values()))
            with torch.no_grad():
                for p, g in zip(params.values(), grads, strict=True):
                    p -= LR * g
        deltas.append({n: (p.detach() - state[n]) for n, p in params.items()})
    return deltas


@pytest.fixture(scope="module")
def setup():
    data = blobs()
    torch.manual_seed(0)
    model = plain_mlp(data)
    return model, get_params(model), data.x_train, data.y_train


def _trainer(model, **kwargs) -> SiteTrainer:
    return SiteTrainer(model, LocalTrainingConfig(lr=LR, batch_size=BATCH), **kwargs)


def test_a_custom_loss_trains_like_a_hand_written_loop_and_unlike_cross_entropy(setup):
    model, state, x, y = setup
    custom = _trainer(model, loss=one_hot_mse)
    default = _trainer(model)

    got = custom.train(state, x, y, SITES, SEEDS)
    ce = default.train(state, x, y, SITES, SEEDS)
    want = _reference(model, state, x, y, custom, one_hot_mse)

    for i, site in enumerate(want):
        for name, delta in site.items():
            torch.testing.assert_close(got.deltas[name][i], delta, rtol=1e-4, atol=1e-6)
    gap = max(float((got.deltas[n] - ce.deltas[n]).abs().max()) for n in state)
    assert gap > 1e-3  # the loss changed the update, not just its rounding


def test_the_per_site_loop_uses_the_custom_loss_too(setup):
    model, state, x, y = setup
    trainer = _trainer(model, loss=one_hot_mse)
    batched = trainer.train(state, x, y, SITES, SEEDS)
    schedules = [trainer._site_schedule(len(s), seed) for s, seed in zip(SITES, SEEDS, strict=True)]

    in_turn = train_sites_in_turn(
        model, state, x, y, SITES, schedules, LR, trainer.device, loss_fn=one_hot_mse
    )

    np.testing.assert_allclose(batched.loss, in_turn.loss, rtol=1e-5)
    for name in state:
        torch.testing.assert_close(batched.deltas[name], in_turn.deltas[name], rtol=1e-4, atol=1e-6)


def test_evaluation_reports_the_custom_loss(setup):
    model, state, x, y = setup
    _, loss = _trainer(model, loss=one_hot_mse).evaluate(state, x, y)

    with torch.no_grad():
        assert loss == pytest.approx(float(one_hot_mse(model(x), y).mean()), rel=1e-5)


def _emulator(workload: pt.CustomWorkload) -> Emulator:
    cfg = pt.build_config(
        None,
        workload=pt.register_workload(workload),
        num_sites=3,
        policies=("select-all",),
        static_sweep=(),
        target_accuracy=0.99,
        max_rounds=1,
    )
    sites = generate_sites(cfg.num_sites, np.random.default_rng(cfg.site_seed))
    fed = build_federation(cfg, load_workload(cfg), 0)
    tm = TimeModel(cfg.ideal_compute_s, cfg.update_bytes, RoundTimeModel.PER_SITE_MAX)
    # plain FedAvg: these tests check what a custom step makes against the exact mean
    return Emulator(
        fed,
        sites,
        StaticPower(sites.base_power),
        ModelledLinks(sites),
        tm,
        0,
        TrajectoryCache(),
        Aggregation("fedavg"),
    )


def test_a_custom_train_step_is_called_and_what_it_made_is_what_fedavg_averages():
    calls: list[tuple[bool, int, float]] = []

    def shift_by_lr(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float) -> float:
        calls.append((model.training, len(y), lr))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(lr)  # every weight moves by lr per step
        return 0.5

    workload = pt.CustomWorkload(
        name="shift-step",
        model=normalised_mlp,
        data=blobs(),
        partitioner=halves,
        lr=0.01,
        batch_size=50,
        train_step=shift_by_lr,
    )
    em = _emulator(workload)
    assert em.fed.trainer.unbatched_reason == "the workload brings its own train_step"
    start = em.state_dict(em.fed.initial_params)

    run = em.run(SelectAll(), None, 1)

    sizes = [len(p) for p in em.fed.partitions]
    steps = [-(-n // 50) for n in sizes]  # one local epoch of batches of 50
    assert len(calls) == sum(steps) and all(training and lr == 0.01 for training, _, lr in calls)
    moved = sum(n * s for n, s in zip(sizes, steps, strict=True)) / sum(sizes) * 0.01
    for name, _ in em.fed.trainer.model.named_parameters():
        torch.testing.assert_close(run.model[name], start[name] + moved)
    torch.testing.assert_close(run.model["1.running_mean"], start["1.running_mean"])  # no forward


@pytest.mark.parametrize(
    ("loss", "message"),
    [
        (lambda logits, y: nn.functional.cross_entropy(logits, y), r"shape \(4,\); got \(\)"),
        (lambda logits, y: torch.log(logits[:, 0] - 1e6), "not finite"),
    ],
)
def test_a_loss_of_the_wrong_shape_or_not_finite_is_refused_naming_the_workload(loss, message):
    workload = pt.CustomWorkload(name="bad-loss", model=plain_mlp, data=blobs(), loss=loss)

    where = r"workload 'bad-loss': loss\(logits, targets\)"
    with pytest.raises(ValueError, match=f"{where}.*{message}"):
        _emulator(workload)


def test_a_loss_vmap_cannot_batch_is_refused_with_the_way_out():
    def one_hot(logits, y):  # reads the labels' values: no vmap rule
        return ((logits - nn.functional.one_hot(y, logits.shape[-1])) ** 2).sum(-1)

    workload = pt.CustomWorkload(name="vmap-loss", model=plain_mlp, data=blobs(), loss=one_hot)

    with pytest.raises(ValueError, match="'vmap-loss'.*cannot batch.*train_step"):
        _emulator(workload)


def test_a_train_step_that_returns_no_loss_is_refused_naming_the_workload():
    workload = pt.CustomWorkload(
        name="silent-step", model=plain_mlp, data=blobs(), train_step=lambda model, x, y, lr: None
    )

    with pytest.raises(ValueError, match="workload 'silent-step': train_step must return"):
        _emulator(workload).run(SelectAll(), None, 1)


def test_a_train_step_with_another_local_optimizer_is_refused():
    name = pt.register_workload(
        pt.CustomWorkload(
            name="step-adamw",
            model=plain_mlp,
            data=blobs(),
            train_step=lambda m, x, y, lr: 0.0,
        )
    )
    cfg = pt.build_config(
        None,
        workload=name,
        num_sites=3,
        policies=("select-all",),
        static_sweep=(),
        target_accuracy=0.9,
        max_rounds=1,
        local_optimizer={"name": "adamw"},
    )

    with pytest.raises(ValueError, match="'step-adamw': its train_step .* plain SGD, got adamw"):
        build_federation(cfg, load_workload(cfg), 0)


def test_the_site_engine_refuses_a_workload_with_its_own_loss():
    name = pt.register_workload(
        pt.CustomWorkload(name="engine-loss", model=plain_mlp, data=blobs(), loss=one_hot_mse)
    )
    cfg = pt.build_config(None, workload=name, static_sweep=(4,), target_accuracy=0.9)
    data = load_workload(cfg)

    with pytest.raises(ValueError, match="'engine-loss': the site engine"):
        site_model_factory(cfg, data, plain_mlp(data))
