"""Keyword Transformer: KWT's layout and sizes, and it trains as stacked site copies under the
batched trainer's vmap(grad), on real FSDD speakers from ../shared/data."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, stack_module_state, vmap

from powertrip.config.experiment import WORKLOAD_DEFAULTS
from powertrip.learning.custom import dataset_from_arrays, declared_workload
from powertrip.learning.datasets import load_speech
from powertrip.learning.kwt import KWT, KWT_SIZES, KWTShape, kwt_shape
from powertrip.learning.models import MODEL_NAMES, build_model, num_parameters
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params


def expected_parameters(shape: KWTShape, frames: int, n_mels: int, classes: int) -> int:
    """KWT counted by hand: patch embedding, class token, positions, blocks, norm, head."""
    d, m = shape.dim, shape.mlp_dim
    block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * m + m) + (m * d + d)
    return (
        (n_mels * d + d)
        + d
        + (frames + 1) * d
        + shape.depth * block
        + 2 * d
        + d * classes
        + classes
    )


def test_kwt_is_the_model_of_both_speech_workloads():
    assert "kwt" in MODEL_NAMES
    frames = dataset_from_arrays(np.zeros((4, 101, 40)), np.arange(4) % 2, num_classes=12)
    for workload in ("speech-commands", "fsdd"):
        model = declared_workload(workload).build_model(frames)
        assert isinstance(model, KWT) and model(frames.x_train).shape == (3, 12)
        defaults = WORKLOAD_DEFAULTS[workload]
        assert (defaults.lr, defaults.batch_size) == (0.05, 20)


def test_frames_in_class_logits_out():
    model = build_model("kwt", num_classes=12, in_shape=(101, 40))
    assert isinstance(model, KWT) and model.shape == KWT_SIZES["tiny"]
    assert model(torch.randn(5, 101, 40)).shape == (5, 12)
    with pytest.raises(ValueError, match="frames, n_mels"):
        build_model("kwt", num_classes=12, in_shape=(1, 101, 40))


@pytest.mark.parametrize("size", sorted(KWT_SIZES))
def test_parameter_count_follows_the_configured_depth_width_and_heads(size):
    shape = KWT_SIZES[size]
    model = build_model("kwt", num_classes=35, in_shape=(98, 40), kwt=shape)
    assert num_parameters(model) == expected_parameters(shape, 98, 40, 35)
    assert list(model.buffers()) == []  # the parameters are the whole state (FedAvg's)


def test_named_sizes_grow_and_kwt1_is_the_papers_size():
    counts = [num_parameters(KWT(35, 98, 40, KWT_SIZES[s])) for s in ("tiny", "kwt1", "kwt2")]
    assert counts[0] < 25_000 < counts[1] < counts[2]
    assert abs(counts[1] / 607_000 - 1) < 0.01  # Berg et al. report 607 k for KWT-1
    deeper = kwt_shape("tiny", depth=4)
    assert deeper.dim == 32 and num_parameters(KWT(35, 98, 40, deeper)) > counts[0]


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="multiple of heads"):
        kwt_shape(dim=30, heads=4)
    with pytest.raises(ValueError, match=">= 1"):
        KWTShape(dim=32, depth=0, heads=2, mlp_dim=64)
    with pytest.raises(ValueError, match="unknown KWT size"):
        kwt_shape("huge")


def test_every_frame_is_attended_to_not_only_earlier_ones():
    torch.manual_seed(0)
    model = KWT(4, frames=10, n_mels=8)
    x = torch.randn(1, 10, 8)
    changed = x.clone()
    changed[0, -1] += 1.0  # the last frame: a causal model's class token would not see it
    assert not torch.allclose(model(x), model(changed))


def test_vmapped_grad_over_stacked_sites_equals_each_models_backward():
    torch.manual_seed(1)
    template = KWT(5, frames=12, n_mels=8, shape=kwt_shape(heads=4))
    copies = [copy.deepcopy(template) for _ in range(3)]
    for site, model in enumerate(copies):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * (site + 1) * torch.randn_like(p))
    params, _ = stack_module_state(copies)
    x, y = torch.randn(3, 4, 12, 8), torch.randint(0, 5, (3, 4))

    def loss(p, xb, yb):
        return F.cross_entropy(functional_call(template, p, (xb,)), yb)

    batched = vmap(grad(loss))(params, x, y)
    for site, model in enumerate(copies):
        model.zero_grad()
        F.cross_entropy(model(x[site]), y[site]).backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(batched[name][site], p.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.extra("speech")
@pytest.mark.real_data("fsdd")
def test_speakers_train_under_the_batched_trainer(shared_data):
    data = load_speech(shared_data / "datasets" / "fsdd", "fsdd")
    rng = np.random.default_rng(0)
    sites = [
        rng.choice(np.flatnonzero(data.groups_train == g), 40, replace=False) for g in range(3)
    ]
    torch.manual_seed(0)
    model = build_model("kwt", data.num_classes, data.in_shape)
    trainer = SiteTrainer(model, LocalTrainingConfig(lr=0.05, batch_size=20, local_epochs=8))
    start = get_params(model)
    updates = trainer.train(start, data.x_train, data.y_train, sites, seeds=[0, 1, 2])
    assert updates.steps.tolist() == [16, 16, 16]
    ratios = {}
    for j, idx in enumerate(sites):
        after = {name: start[name] + updates.deltas[name][j] for name in start}
        x, y = data.x_train[idx], data.y_train[idx]
        loss_before = trainer.evaluate(start, x, y)[1]
        ratios[data.group_names[j]] = trainer.evaluate(after, x, y)[1] / loss_before
    assert all(r < 0.85 for r in ratios.values()), ratios  # each speaker's own loss fell
