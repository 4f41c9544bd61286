"""The stacked engine (one plain model over all sites, hand-written backward pass) must train
exactly what the vmap engine trains, to float32 rounding, and leave any model it does not know
to vmap."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from powertrip.learning.engines.stacked import stacked_chain
from powertrip.learning.models import CNN1D, CNN2D, CharLSTM
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params


def _data(n: int = 120, channels: int = 2, length: int = 12, classes: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, channels, length, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return x, y


def _cnn1d() -> nn.Module:
    torch.manual_seed(0)
    return CNN1D(num_classes=4, in_channels=2, length=12, channels=5)


def _odd_convs() -> nn.Module:
    """Strides and paddings the CNN1D does not have: uncovered and doubly covered positions."""
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv1d(2, 3, kernel_size=4, stride=2, padding=3),
        nn.Tanh(),
        nn.Conv1d(3, 3, kernel_size=2, stride=3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3 * 3, 6),
        nn.ReLU(),
        nn.Linear(6, 4),
    )


def _both(model: nn.Module, cfg: LocalTrainingConfig) -> tuple[SiteTrainer, SiteTrainer]:
    stacked = SiteTrainer(model, cfg, device="cpu")
    assert stacked.engine.name == "stacked"  # "auto" takes the fast path for this model
    return stacked, SiteTrainer(model, cfg, device="cpu", engine="vmap")


def _assert_same_updates(got, want, rtol: float = 1e-5) -> None:
    np.testing.assert_array_equal(got.steps, want.steps)
    np.testing.assert_array_equal(got.num_samples, want.num_samples)
    np.testing.assert_allclose(got.loss, want.loss, rtol=rtol)
    for name, d in want.deltas.items():
        scale = float(d.abs().max())
        assert got.deltas[name].shape == d.shape
        assert got.deltas[name].device.type == "cpu"  # handed back on the host
        assert float((got.deltas[name] - d).abs().max()) <= rtol * scale + 1e-7, name


UNEVEN = [np.arange(0, 3), np.arange(3, 40), np.arange(40, 49), np.arange(50, 51)]


@pytest.mark.parametrize("model", [_cnn1d, _odd_convs], ids=["cnn1d", "odd-convs"])
@pytest.mark.parametrize("sites", [1, 2, 4])
@pytest.mark.parametrize(
    ("epochs", "cap"), [(1, 1), (2, None), (3, 10)], ids=["1-step", "2-epochs", "capped"]
)
def test_stacked_sites_get_the_vmapped_updates(model, sites, epochs, cap):
    x, y = _data()
    cfg = LocalTrainingConfig(lr=0.3, batch_size=5, local_epochs=epochs, max_local_steps=cap)
    stacked, vmapped = _both(model(), cfg)
    parts, seeds = UNEVEN[:sites], [7, 8, 9, 10][:sites]
    start = get_params(stacked.model)

    _assert_same_updates(
        stacked.train(start, x, y, parts, seeds), vmapped.train(start, x, y, parts, seeds)
    )


def test_sites_that_finish_early_and_padded_batches_match_training_alone():
    """Partitions of 1 to 37 samples with batch 5: sites drop out of the stacked batch as they
    finish, and last batches are padded; each site still gets its lone-SGD update."""
    x, y = _data()
    cfg = LocalTrainingConfig(lr=0.2, batch_size=5, local_epochs=2)
    model = _cnn1d()
    trainer = SiteTrainer(model, cfg, device="cpu")
    start = get_params(model)
    together = trainer.train(start, x, y, UNEVEN, [1, 2, 3, 4])

    for j, (idx, seed) in enumerate(zip(UNEVEN, [1, 2, 3, 4], strict=True)):
        alone = _cnn1d()
        opt = torch.optim.SGD(alone.parameters(), lr=cfg.lr)
        for row in trainer._site_schedule(len(idx), seed):
            rows = idx[row[row >= 0]]
            opt.zero_grad()
            nn.functional.cross_entropy(alone(x[rows]), y[rows]).backward()
            opt.step()
        for name, p in alone.named_parameters():
            torch.testing.assert_close(
                together.deltas[name][j], p.detach() - start[name], rtol=1e-4, atol=1e-6
            )


def test_a_sites_stacked_update_does_not_depend_on_its_peers():
    x, y = _data()
    trainer = SiteTrainer(_cnn1d(), LocalTrainingConfig(lr=0.3, batch_size=5), device="cpu")
    start = get_params(trainer.model)
    three = trainer.train(start, x, y, UNEVEN[:3], [5, 6, 7])
    alone = trainer.train(start, x, y, UNEVEN[1:2], [6])
    for name, d in alone.deltas.items():
        torch.testing.assert_close(three.deltas[name][1], d[0], rtol=1e-5, atol=1e-7)


def test_a_step_gathers_only_the_rows_its_fullest_site_has():
    """Sites of 1-2 samples with batch 20: the step computes 2 rows per site, not 20, and
    still trains exactly what full padded batches train (masked rows weigh nothing)."""
    x, y = _data()
    cfg = LocalTrainingConfig(lr=0.3, batch_size=20)
    model = _cnn1d()
    seen: list[int] = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[-3]))
    vmapped = SiteTrainer(model, cfg, device="cpu", engine="vmap")  # hooks run under vmap
    tiny = [np.arange(0, 2), np.arange(2, 3), np.arange(3, 5)]
    start = get_params(model)

    got = vmapped.train(start, x, y, tiny, [1, 2, 3])

    assert seen == [2]  # one step of 2 rows per site
    stacked = SiteTrainer(model, cfg, device="cpu").train(start, x, y, tiny, [1, 2, 3])
    _assert_same_updates(stacked, got)


@pytest.mark.parametrize(
    "model",
    [
        lambda: CNN2D(num_classes=3, in_hw=(8, 8), width=0.1),
        lambda: CharLSTM(vocab_size=5, hidden_size=4),
        lambda: nn.Sequential(nn.Flatten(), nn.Linear(8, 4), nn.GELU(), nn.Linear(4, 2)),
        lambda: nn.Sequential(nn.Flatten(), nn.Linear(8, 2, bias=False)),
        lambda: nn.Sequential(nn.Conv1d(1, 2, 3, dilation=2), nn.Flatten(), nn.Linear(8, 2)),
        lambda: nn.Sequential(nn.Linear(8, 4), nn.Conv1d(1, 2, 3)),  # a conv after a linear
        lambda: nn.Sequential(nn.Conv1d(1, 2, 3), nn.Linear(6, 2)),  # linear on [C, L]
    ],
    ids=["cnn2d", "lstm", "gelu", "no-bias", "dilated", "conv-after-linear", "linear-on-cl"],
)
def test_models_that_are_not_known_chains_train_with_vmap(model):
    assert stacked_chain(model()) is None


def test_a_subclass_with_its_own_forward_is_read_by_its_forward():
    class Doubled(CNN1D):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    assert stacked_chain(Doubled()) is None
    assert stacked_chain(CNN1D()) is not None


class _Own(nn.Module):
    """A user's module: a conv, a hidden linear layer and a head, its forward given as ``f``."""

    def __init__(self, forward) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 3, 3, stride=2, padding=1)
        self.hidden = nn.Linear(3 * 6, 5)
        self.out = nn.Linear(5, 4)
        self.act = nn.ReLU()
        self.flat = nn.Flatten()
        self.f = forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self, x)


CHAINS = {
    "F.relu, .flatten(1)": lambda m, x: m.out(F.relu(m.hidden(F.relu(m.conv(x)).flatten(1)))),
    "torch.relu, torch.flatten": lambda m, x: m.out(
        torch.relu(m.hidden(torch.flatten(torch.relu(m.conv(x)), 1)))
    ),
    "modules, .relu(), tanh": lambda m, x: m.out(torch.tanh(m.hidden(m.flat(m.act(m.conv(x)))))),
    "flatten(start_dim=1)": lambda m, x: m.out(m.hidden(m.conv(x).relu().flatten(start_dim=1))),
}
NOT_CHAINS = {
    "flatten(0)": lambda m, x: m.out(m.hidden(F.relu(m.conv(x)).flatten(0))),
    "view": lambda m, x: m.out(m.hidden(F.relu(m.conv(x)).view(x.shape[0], -1))),
    "unused parameter": lambda m, x: m.out(torch.ones(x.shape[0], 5)),
    "scaled": lambda m, x: m.out(m.hidden(m.conv(x).flatten(1))) * 2,
    "skip": lambda m, x: m.out(m.hidden(m.conv(x).flatten(1)) + 1),
}


@pytest.mark.parametrize("forward", CHAINS.values(), ids=CHAINS)
def test_a_users_own_module_whose_forward_is_a_chain_trains_stacked(forward):
    x, y = _data()
    cfg = LocalTrainingConfig(lr=0.3, batch_size=5, local_epochs=2)
    torch.manual_seed(0)
    model = _Own(forward)
    stacked, vmapped = _both(model, cfg)
    start = get_params(model)
    _assert_same_updates(
        stacked.train(start, x, y, UNEVEN, [1, 2, 3, 4]),
        vmapped.train(start, x, y, UNEVEN, [1, 2, 3, 4]),
    )


@pytest.mark.parametrize("forward", NOT_CHAINS.values(), ids=NOT_CHAINS)
def test_a_forward_that_is_not_one_straight_chain_is_not_stacked(forward):
    assert stacked_chain(_Own(forward)) is None


def test_a_layer_used_twice_is_not_stacked():
    shared = nn.Linear(4, 4)
    assert stacked_chain(nn.Sequential(nn.Flatten(), shared, nn.ReLU(), shared)) is None


def test_labels_per_position_train_with_vmap():
    chain = stacked_chain(nn.Sequential(nn.Linear(8, 3)))
    assert chain is not None
    assert chain.accepts(torch.zeros(4, 8), torch.zeros(4, dtype=torch.long))
    assert not chain.accepts(torch.zeros(4, 6, 8), torch.zeros(4, 6, dtype=torch.long))


def test_the_trainer_says_once_which_model_trains_stacked(caplog):
    with caplog.at_level(logging.INFO, logger="powertrip.learning.engines"):
        SiteTrainer(_cnn1d(), LocalTrainingConfig(lr=0.1, batch_size=4), device="cpu")
        SiteTrainer(
            _cnn1d(), LocalTrainingConfig(lr=0.1, batch_size=4), device="cpu", engine="vmap"
        )
    assert caplog.text.count("training CNN1D sites stacked") == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model", [_cnn1d, _odd_convs], ids=["cnn1d", "odd-convs"])
def test_stacked_training_on_cuda_gets_the_cpu_updates(model):
    # the GPU's own summation order is the only difference, hence float32 tolerance, not equality
    x, y = _data()
    cfg = LocalTrainingConfig(lr=0.3, batch_size=5, local_epochs=2)
    on_gpu = SiteTrainer(model(), cfg, device="cuda")
    on_cpu = SiteTrainer(model(), cfg, device="cpu")
    assert on_gpu.engine.name == "stacked" and on_gpu.device.type == "cuda"
    start = get_params(on_cpu.model)
    seeds = [7, 8, 9, 10]
    _assert_same_updates(
        on_gpu.train(start, x, y, UNEVEN, seeds), on_cpu.train(start, x, y, UNEVEN, seeds), 1e-4
    )
