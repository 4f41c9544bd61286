"""The batched trainer must be exactly "every site trains alone", only faster."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params


def _tiny_problem(n: int = 90, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, generator=g)
    y = (x.sum(dim=(1, 2)) > 0).long()
    return x, y


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 2))


def _train_alone(model: nn.Module, x, y, idx: np.ndarray, order: np.ndarray, lr: float, b: int):
    """Reference: plain SGD over one site's samples in the given order, partial last batch."""
    m = _model()
    m.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    for start in range(0, len(order), b):
        rows = idx[order[start : start + b]]
        opt.zero_grad()
        nn.functional.cross_entropy(m(x[rows]), y[rows]).backward()
        opt.step()
    return {k: v.detach() for k, v in m.named_parameters()}


def test_batched_sites_match_training_each_site_alone():
    x, y = _tiny_problem()
    model = _model()
    cfg = LocalTrainingConfig(lr=0.3, batch_size=4)
    trainer = SiteTrainer(model, cfg, device=torch.device("cpu"))
    sites = [np.arange(0, 10), np.arange(10, 37), np.arange(40, 47)]  # unequal sizes
    seeds = [11, 12, 13]

    updates = trainer.train(get_params(model), x, y, sites, seeds)

    for j, (idx, seed) in enumerate(zip(sites, seeds, strict=True)):
        order = np.random.default_rng(seed).permutation(len(idx))
        expected = _train_alone(model, x, y, idx, order, cfg.lr, cfg.batch_size)
        for name, w0 in get_params(model).items():
            torch.testing.assert_close(
                updates.deltas[name][j], expected[name] - w0, rtol=1e-4, atol=1e-5
            )
    assert list(updates.steps) == [3, 7, 2]  # ceil(n / batch) for one local epoch
    assert list(updates.num_samples) == [10, 27, 7]


def test_a_sites_update_does_not_depend_on_its_peers():
    x, y = _tiny_problem()
    model = _model()
    trainer = SiteTrainer(model, LocalTrainingConfig(lr=0.1, batch_size=5))
    alone = trainer.train(get_params(model), x, y, [np.arange(20)], [7])
    together = trainer.train(get_params(model), x, y, [np.arange(30, 80), np.arange(20)], [3, 7])
    for name in alone.deltas:
        torch.testing.assert_close(together.deltas[name][1], alone.deltas[name][0])


def test_more_sites_than_one_vmap_chunk_are_trained_in_chunks():
    x, y = _tiny_problem()
    model = _model()
    trainer = SiteTrainer(model, LocalTrainingConfig(lr=0.1, batch_size=5), max_parallel_sites=2)
    sites = [np.arange(i * 10, i * 10 + 10) for i in range(5)]
    updates = trainer.train(get_params(model), x, y, sites, list(range(5)))
    assert updates.deltas["1.weight"].shape == (5, 6, 8)
    reference = SiteTrainer(model, LocalTrainingConfig(lr=0.1, batch_size=5)).train(
        get_params(model), x, y, sites, list(range(5))
    )
    torch.testing.assert_close(updates.deltas["1.weight"], reference.deltas["1.weight"])


def test_local_epochs_and_step_cap_set_the_number_of_steps():
    x, y = _tiny_problem()
    model = _model()
    two_epochs = SiteTrainer(model, LocalTrainingConfig(lr=0.1, batch_size=4, local_epochs=2))
    capped = SiteTrainer(
        model, LocalTrainingConfig(lr=0.1, batch_size=4, local_epochs=2, max_local_steps=3)
    )
    assert two_epochs.train(get_params(model), x, y, [np.arange(10)], [0]).steps[0] == 6
    assert capped.train(get_params(model), x, y, [np.arange(10)], [0]).steps[0] == 3


def test_evaluate_reports_accuracy_of_the_given_parameters():
    x, y = _tiny_problem()
    model = _model()
    trainer = SiteTrainer(model, LocalTrainingConfig(lr=0.1, batch_size=4))
    params = get_params(model)
    acc, loss = trainer.evaluate(params, x, y, batch_size=7)
    with torch.no_grad():
        logits = model(x)
    assert acc == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    assert abs(loss - float(nn.functional.cross_entropy(logits, y))) < 1e-5


def test_bad_training_requests_are_refused():
    x, y = _tiny_problem()
    model = _model()
    trainer = SiteTrainer(model, LocalTrainingConfig(lr=0.1, batch_size=4))

    with pytest.raises(ValueError, match="one seed per site"):
        trainer.train(get_params(model), x, y, [np.arange(3)], [1, 2])
    with pytest.raises(ValueError, match="no training samples"):
        trainer.train(get_params(model), x, y, [np.arange(0)], [1])
    with pytest.raises(ValueError, match="positive"):
        LocalTrainingConfig(lr=0.0, batch_size=4)


def test_updates_come_back_in_host_memory():
    x, y = _tiny_problem()
    model = _model()
    trainer = SiteTrainer(model, LocalTrainingConfig(lr=0.1, batch_size=4))

    updates = trainer.train(get_params(model), x, y, [np.arange(10), np.arange(20, 25)], [0, 1])

    assert all(d.device.type == "cpu" for d in updates.deltas.values())
    assert isinstance(updates.loss, np.ndarray) and updates.loss.shape == (2,)
