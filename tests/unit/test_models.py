"""Models: right shapes, the paper's sizes, and trainable as stacked site copies under vmap."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

from powertrip.learning.datasets import load_mnist1d
from powertrip.learning.models import (
    CNN1D,
    CNN2D,
    CharLSTM,
    build_model,
    num_parameters,
)

SITES = 3


def small_models() -> dict[str, tuple[nn.Module, torch.Tensor, torch.Tensor]]:
    """One small instance of each architecture with a per-site batch [SITES, B, ...]."""
    g = torch.Generator().manual_seed(0)
    return {
        "cnn1d": (
            CNN1D(num_classes=10),
            torch.randn(SITES, 5, 1, 40, generator=g),
            torch.randint(0, 10, (SITES, 5), generator=g),
        ),
        "cnn2d": (
            CNN2D(num_classes=62, width=0.125),
            torch.rand(SITES, 4, 1, 28, 28, generator=g),
            torch.randint(0, 62, (SITES, 4), generator=g),
        ),
        "lstm": (
            CharLSTM(vocab_size=81, hidden_size=16),
            torch.randint(0, 81, (SITES, 4, 12), generator=g),
            torch.randint(0, 81, (SITES, 4), generator=g),
        ),
    }


@pytest.mark.parametrize("name", ["cnn1d", "cnn2d", "lstm"])
def test_vmapped_grad_over_stacked_site_params_equals_per_model_backward(name):
    template, x, y = small_models()[name]
    torch.manual_seed(1)
    copies = [copy.deepcopy(template) for _ in range(SITES)]
    for site, model in enumerate(copies):  # make the sites differ
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * (site + 1) * torch.randn_like(p))
    params, buffers = stack_module_state(copies)
    base = copy.deepcopy(template).to("meta")

    def loss(p, b, xb, yb):
        return F.cross_entropy(functional_call(base, (p, b), (xb,)), yb)

    stacked = vmap(grad(loss))(params, buffers, x, y)

    for site, model in enumerate(copies):
        model.zero_grad()
        F.cross_entropy(model(x[site]), y[site]).backward()
        for pname, p in model.named_parameters():
            torch.testing.assert_close(stacked[pname][site], p.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["cnn1d", "cnn2d", "lstm"])
def test_models_have_no_buffers_so_parameters_are_the_whole_state(name):
    model, _, _ = small_models()[name]
    assert list(model.buffers()) == []


def test_cnn1d_is_small_and_outputs_class_logits():
    model = build_model("cnn1d", num_classes=10, in_shape=(1, 40))
    assert 3_000 <= num_parameters(model) <= 10_000
    assert model(torch.randn(7, 1, 40)).shape == (7, 10)


def test_cnn2d_is_leafs_femnist_cnn_at_full_width():
    model = build_model("cnn2d", num_classes=62, in_shape=(1, 28, 28))
    assert [m.out_channels for m in (model.conv1, model.conv2)] == [32, 64]
    assert model.fc1.out_features == 2048 and model.fc2.out_features == 62
    assert num_parameters(model) == 6_603_710
    assert model(torch.rand(2, 1, 28, 28)).shape == (2, 62)


def test_cnn2d_width_scales_the_hidden_sizes():
    small = CNN2D(num_classes=10, width=0.25)
    assert small.fc1.out_features == 512 and num_parameters(small) < 500_000


def test_char_lstm_predicts_one_next_char_per_sequence():
    model = build_model("lstm", num_classes=81, in_shape=(80,))
    assert model.embed.embedding_dim == 8 and model.hidden_size == 100
    assert len(model.input_proj) == 2
    assert model(torch.randint(0, 81, (3, 80))).shape == (3, 81)


def test_char_lstm_recurrence_matches_torch_lstm():
    torch.manual_seed(0)
    ours = CharLSTM(vocab_size=20, embed_dim=8, hidden_size=12, num_layers=2)
    ref = nn.LSTM(8, 12, num_layers=2, batch_first=True)
    with torch.no_grad():
        for layer in range(2):
            ours.input_proj[layer].weight.copy_(getattr(ref, f"weight_ih_l{layer}"))
            ours.input_proj[layer].bias.copy_(
                getattr(ref, f"bias_ih_l{layer}") + getattr(ref, f"bias_hh_l{layer}")
            )
            ours.hidden_proj[layer].weight.copy_(getattr(ref, f"weight_hh_l{layer}"))
    x = torch.randint(0, 20, (4, 9))
    out, _ = ref(ours.embed(x))
    torch.testing.assert_close(ours(x), ours.head(out[:, -1]))


def test_build_model_rejects_unknown_names():
    with pytest.raises(ValueError, match="valid names: cnn1d, cnn2d, lstm"):
        build_model("resnet50", num_classes=10, in_shape=(3, 32, 32))


def test_build_model_checks_the_input_shape():
    with pytest.raises(ValueError, match="cnn2d needs in_shape"):
        build_model("cnn2d", num_classes=10, in_shape=(1, 40))


@pytest.mark.slow
def test_cnn1d_learns_mnist1d_centrally(tmp_path):
    """Three epochs of plain SGD (lr 0.2, batch 20) on 20k samples clear 85% test accuracy."""
    ds = load_mnist1d(num_samples=20_000, cache_dir=tmp_path)
    torch.manual_seed(0)
    model = build_model("cnn1d", ds.num_classes, ds.in_shape)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    for _ in range(3):
        for idx in torch.randperm(len(ds.y_train)).split(20):
            opt.zero_grad()
            F.cross_entropy(model(ds.x_train[idx]), ds.y_train[idx]).backward()
            opt.step()
    with torch.no_grad():
        accuracy = (model(ds.x_test).argmax(1) == ds.y_test).float().mean()
    assert float(accuracy) >= 0.85
