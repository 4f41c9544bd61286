"""The GPT-style language model: causal, sized by configuration, and trainable by the batched
(vmap) trainer that every workload goes through."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from powertrip.learning.datasets.text import BYTE_VOCAB, load_text
from powertrip.learning.gpt import GPT_SIZES, gpt_shape
from powertrip.learning.models import build_model, num_parameters
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params
from tests.needs import real_data_reason


def _gpt(**overrides: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("gpt", BYTE_VOCAB, (32,), gpt=gpt_shape("tiny", **overrides))


def test_changing_a_future_token_leaves_every_earlier_prediction_unchanged():
    model = _gpt(context_length=32)
    idx = torch.randint(0, BYTE_VOCAB, (2, 32))
    later = idx.clone()
    later[:, 20:] = (later[:, 20:] + 7) % BYTE_VOCAB

    with torch.no_grad():
        a, b = model(idx), model(later)

    assert a.shape == (2, 32, BYTE_VOCAB)
    torch.testing.assert_close(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def test_the_smallest_size_has_about_a_million_parameters_and_sizes_grow():
    counts = [
        num_parameters(build_model("gpt", BYTE_VOCAB, (s.context_length,), gpt=s))
        for s in (GPT_SIZES["tiny"], GPT_SIZES["small"])
    ]

    assert 0.8e6 <= counts[0] <= 1.2e6
    assert counts[1] > 5 * counts[0]
    assert (
        num_parameters(_gpt(n_layer=6)) > num_parameters(_gpt()) > num_parameters(_gpt(d_model=64))
    )


def test_the_model_has_no_buffers_so_its_state_is_exactly_its_parameters():
    model = _gpt()

    assert list(model.buffers()) == []
    assert set(get_params(model)) == set(model.state_dict())


def test_a_shape_the_attention_cannot_split_is_refused():
    with pytest.raises(ValueError, match="not a multiple of n_head"):
        gpt_shape("tiny", d_model=100, n_head=3)
    with pytest.raises(ValueError, match="unknown model size"):
        gpt_shape("huge")


def test_validation_loss_falls_on_tinyshakespeare_in_a_few_batched_steps(shared_data):
    text = shared_data / "datasets" / "tinyshakespeare" / "input.txt"
    if not text.is_file():
        pytest.skip(real_data_reason("tinyshakespeare"))
    data = load_text(text, context_length=64, max_samples=640)
    torch.manual_seed(0)
    model = build_model("gpt", data.num_classes, (64,), gpt=gpt_shape(n_layer=2, d_model=64))
    trainer = SiteTrainer(model, LocalTrainingConfig(lr=0.1, batch_size=16))
    start = get_params(model)
    x_val, y_val = data.x_test[:64], data.y_test[:64]
    _, before = trainer.evaluate(start, x_val, y_val)

    sites = [np.arange(0, 320), np.arange(320, 640)]  # two sites, one vmapped call
    upd = trainer.train(start, data.x_train, data.y_train, sites, seeds=[0, 1])
    averaged = {k: start[k] + upd.deltas[k].mean(0) for k in start}
    _, after = trainer.evaluate(averaged, x_val, y_val)

    assert before == pytest.approx(math.log(BYTE_VOCAB), abs=0.2)  # uniform at initialisation
    assert after < before - 1.0
    assert list(upd.steps) == [20, 20]


def test_the_configs_size_names_are_the_models_size_table():
    """The torch-free run definition lists the sizes by name; the model owns their shapes."""
    from typing import get_args

    from powertrip.config.experiment import ModelSize

    assert list(get_args(ModelSize)) == list(GPT_SIZES)
