"""The elastic learner (the work-weighted FedAvg of the curtailment-window study, arXiv
2602.22760): sites train on exactly their rows, updates are averaged weighted by batches, solo
checkpoints do not change the trajectory, and the optional DiLoCo-style Nesterov outer step
follows its formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from powertrip.aggregation.outer_step import NesterovOuter
from powertrip.curtailment.learner import StreamLearner
from powertrip.curtailment.run_model import Checkpoints, SiteWork
from powertrip.learning.models import build_model
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params

BATCH = 8


@pytest.fixture(scope="module")
def setup():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 1, 40, generator=g)
    y = torch.randint(0, 10, (200,), generator=g)
    torch.manual_seed(0)
    model = build_model("cnn1d", num_classes=10, in_shape=(1, 40))
    trainer = SiteTrainer(model, LocalTrainingConfig(lr=0.1, batch_size=BATCH, shuffle=False))
    return trainer, x, y, get_params(model)


def learner(setup, outer=None) -> StreamLearner:
    trainer, x, y, params = setup
    order = np.random.default_rng(1).permutation(200)
    return StreamLearner(trainer, x, y, x[:50], y[:50], order, params, outer)


def work(site: int, first: int, steps: int, rows: int | None = None) -> SiteWork:
    n = steps * BATCH if rows is None else rows
    return SiteWork(site, steps, np.arange(first, first + n), 0.0, 1.0, False)


def alone(setup, rows: np.ndarray) -> dict[str, torch.Tensor]:
    """The model one site reaches training by itself on ``rows`` (stream positions)."""
    trainer, x, y, params = setup
    order = np.random.default_rng(1).permutation(200)
    upd = trainer.train(params, x, y, [order[rows]], [0])
    return {k: params[k] + upd.deltas[k][0] for k in params}


def test_the_global_model_is_the_batch_weighted_mean_of_the_sites_models(setup):
    a, b = work(0, 0, 5), work(1, 40, 2, rows=13)  # b's last batch is partial: still 2 steps
    lr = learner(setup)

    lr.train_round([a, b], None)

    wa, wb = alone(setup, a.rows), alone(setup, b.rows)
    for k, v in lr.params.items():
        torch.testing.assert_close(v, (5 * wa[k] + 2 * wb[k]) / 7, rtol=1e-5, atol=1e-6)


def test_a_site_without_steps_changes_nothing(setup):
    lr = learner(setup)
    before = {k: v.clone() for k, v in lr.params.items()}

    out = lr.train_round([work(0, 0, 0, rows=0)], None)

    assert all(torch.equal(before[k], lr.params[k]) for k in before)
    assert (out.accuracy, out.loss) == lr.evaluate()


def test_solo_checkpoints_evaluate_along_the_way_without_changing_the_trajectory(setup):
    plain, checked = learner(setup), learner(setup)

    plain.train_round([work(0, 0, 9)], None)
    out = checked.train_round([work(0, 0, 9)], Checkpoints(0, (3, 6)))

    assert len(out.checkpoints) == 2
    for k in plain.params:
        torch.testing.assert_close(plain.params[k], checked.params[k], rtol=1e-5, atol=1e-6)


def test_nesterov_outer_step_extrapolates_the_averaged_update(setup):
    fedavg, nesterov = learner(setup), learner(setup, NesterovOuter(lr=0.7, momentum=0.9))
    start = {k: v.clone() for k, v in fedavg.params.items()}
    round_ = [work(0, 0, 4), work(1, 32, 4)]

    fedavg.train_round(round_, None)
    nesterov.train_round(round_, None)

    # First round: m = Δ = w_prev - w_avg, w = w_prev - 0.7 (0.9 Δ + Δ).
    for k in start:
        delta = start[k] - fedavg.params[k]
        torch.testing.assert_close(
            nesterov.params[k], start[k] - 0.7 * 1.9 * delta, rtol=1e-5, atol=1e-6
        )


def test_a_previewed_outer_step_leaves_the_momentum_alone():
    outer = NesterovOuter(lr=1.0, momentum=0.5)
    prev, avg = {"w": np.array([1.0])}, {"w": np.array([0.0])}

    preview = outer.step(prev, avg, commit=False)
    first = outer.step(prev, avg)
    second = outer.step(prev, avg)

    assert preview["w"] == first["w"] == pytest.approx(1.0 - (0.5 * 1 + 1))
    assert second["w"] == pytest.approx(1.0 - (0.5 * 1.5 + 1))  # m = 0.5 * 1 + 1


def test_a_shuffling_trainer_is_refused(setup):
    _, x, y, params = setup
    shuffling = SiteTrainer(
        build_model("cnn1d", num_classes=10, in_shape=(1, 40)),
        LocalTrainingConfig(lr=0.1, batch_size=BATCH),
    )

    with pytest.raises(ValueError, match="unshuffled"):
        StreamLearner(shuffling, x, y, x, y, np.arange(200), params)
