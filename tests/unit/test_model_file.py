"""The model file: safetensors weights plus the card that rebuilds the model, written by the study
commands and the aggregator and read back by ``load_model`` (powertrip/learning/model_file.py)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from safetensors.numpy import save
from torch import nn

import powertrip as pt
from powertrip.config.experiment import build_config
from powertrip.learning.custom import declared_workload
from powertrip.learning.model_file import (
    FORMAT,
    ModelCard,
    ModelFileError,
    ModelSpec,
    StateLayout,
    card_path,
    load_model,
    read_model,
    read_model_card,
    save_model,
    weights_path,
)
from powertrip.learning.site_params import get_params

MNIST1D = ModelSpec("mnist1d", "image", 10, (1, 40), "float32")


def _trained_like(model: nn.Module, seed: int = 7) -> nn.Module:
    """``model`` with weights no fresh model of the workload has."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def _mnist1d_model() -> tuple[nn.Module, ModelCard]:
    cfg = build_config("quick", num_sites=4, num_samples=1000)
    model = _trained_like(declared_workload("mnist1d").build_model(MNIST1D.shape_only()))
    card = ModelCard(
        "mnist1d",
        "experiment",
        json.loads(cfg.model_dump_json()),
        MNIST1D,
        round=12,
        accuracy=0.625,
        loss=1.25,
        policy="powertrip",
        repeat=1,
        source="experiment",
    )
    return model, card


def _same_state(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_saved_model_loads_back_with_the_same_weights_and_card(tmp_path):
    model, card = _mnist1d_model()

    written = save_model(tmp_path / "final", model.state_dict(), card)
    loaded = load_model(written)

    assert written == tmp_path / "final.safetensors"
    assert type(loaded) is type(model) and not loaded.training
    assert _same_state(loaded, model)
    assert read_model_card(written) == card
    beside = json.loads(card_path(written).read_text())  # the same card, for people and tools
    assert beside["round"] == 12 and beside["accuracy"] == 0.625 and beside["format"] == FORMAT


def test_the_package_exports_save_and_load(tmp_path):
    model, card = _mnist1d_model()

    pt.save_model(tmp_path / "m.safetensors", model.state_dict(), card)

    assert _same_state(pt.load_model(tmp_path / "m.json"), model)  # either name of the pair


def test_a_model_sized_by_the_run_is_rebuilt_from_the_cards_settings(tmp_path):
    cfg = build_config("quick", workload="lm", n_layer=1, d_model=32, n_head=2, context_length=16)
    spec = ModelSpec("lm", "lm", 256, (16,), "int64")
    lm = declared_workload("lm")
    model = _trained_like(lm.initial_model(cfg, spec.shape_only()))
    card = ModelCard("lm", "experiment", json.loads(cfg.model_dump_json()), spec)

    loaded = load_model(save_model(tmp_path / "lm", model.state_dict(), card))

    assert _same_state(loaded, model)
    tokens = torch.randint(0, 256, (2, 16))
    assert torch.equal(loaded(tokens), model.eval()(tokens))


def test_a_tensor_of_another_shape_is_refused_naming_it(tmp_path):
    model, card = _mnist1d_model()
    path = save_model(tmp_path / "m", model.state_dict(), card)
    tensors, _ = read_model(path)
    name = next(n for n, a in tensors.items() if a.ndim > 1)
    tensors[name] = tensors[name].reshape(-1)  # same bytes, another shape
    path.write_bytes(save(tensors, metadata={"powertrip": card.to_json()}))

    with pytest.raises(ModelFileError, match=rf"{name} has shape \(\d+,\) in the file"):
        load_model(path)


def test_a_file_missing_a_tensor_is_refused_naming_it(tmp_path):
    model, card = _mnist1d_model()
    state = dict(model.state_dict())
    dropped = next(iter(state))
    del state[dropped]

    with pytest.raises(ModelFileError, match=rf"missing \['{dropped}'\]"):
        load_model(save_model(tmp_path / "m", state, card))


def test_a_pickle_is_refused_unread(tmp_path):
    model, _ = _mnist1d_model()
    path = weights_path(tmp_path / "m")
    torch.save(model.state_dict(), path)  # a pickle under the model file's name

    with pytest.raises(ModelFileError, match="is not a safetensors file"):
        load_model(path)


def test_loading_never_unpickles(tmp_path, monkeypatch):
    model, card = _mnist1d_model()
    path = save_model(tmp_path / "m", model.state_dict(), card)

    def refuse(*args, **kwargs):
        raise AssertionError("pickle used")

    for name in ("Unpickler", "load", "loads"):
        monkeypatch.setattr(pickle, name, refuse)
    assert _same_state(load_model(path), model)


def test_a_card_of_another_format_is_refused(tmp_path):
    model, card = _mnist1d_model()
    path = save_model(tmp_path / "m", model.state_dict(), card)
    tensors, _ = read_model(path)
    other = json.dumps({**json.loads(card.to_json()), "format": "powertrip-model/99"})
    path.write_bytes(save(tensors, metadata={"powertrip": other}))

    with pytest.raises(ModelFileError, match="format 'powertrip-model/99'"):
        read_model(path)


def test_the_full_state_takes_averaged_values_and_keeps_the_rest():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(5, 3)
            self.norm = nn.BatchNorm1d(3)
            self.head = nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    averaged = {n: t.detach().numpy() + 1.0 for n, t in get_params(model).items()}

    full = StateLayout(model, averaged).full(averaged)

    assert list(full) == list(model.state_dict())
    assert full["head.weight"] is averaged["embed.weight"]  # the tied twin's value
    assert full["norm.running_mean"] is averaged["norm.running_mean"]
    assert full["norm.num_batches_tracked"].dtype == np.int64  # not averaged: kept as built
