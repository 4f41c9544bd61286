"""What GetModel hands out (services/aggregator/served_model.py): the last published model with
the card of its round, streamed as the card then a checked tensor stream, and written as a model
file when the run ends."""

from __future__ import annotations

import json

import numpy as np
from torch import nn

from powertrip.config.experiment import build_config
from powertrip.learning.model_file import ModelCard, ModelSpec, load_model
from powertrip.learning.site_params import get_params
from powertrip.learning.workloads.mnist1d import MNIST1D
from powertrip.services.aggregator.served_model import ServedModel, model_replies
from powertrip.services.common.tensor_receiver import TensorStreamReceiver

SPEC = ModelSpec("mnist1d", "image", 10, (1, 40), "float32")


def _served() -> tuple[nn.Module, ServedModel, dict[str, np.ndarray]]:
    cfg = build_config("quick", num_sites=4, num_samples=1000)
    model = MNIST1D.build_model(SPEC.shape_only())
    params = {n: t.detach().numpy().copy() for n, t in get_params(model).items()}
    card = ModelCard("mnist1d", "experiment", json.loads(cfg.model_dump_json()), SPEC)
    return model, ServedModel(model, params, card), params


def test_the_current_model_is_the_last_published_with_its_rounds_card():
    model, served, params = _served()
    later = {n: a + 1.0 for n, a in params.items()}

    served.publish(later, 7, 0.5, 1.5)
    state, card = served.current()

    assert list(state) == list(model.state_dict())
    assert all(np.array_equal(state[n], later[n]) for n in later)
    assert (card.round, card.accuracy, card.loss) == (7, 0.5, 1.5)


def test_the_replies_are_the_card_then_a_stream_that_checks_out_whole():
    _, served, params = _served()
    served.publish(params, 3, 0.25, 2.0)
    state, card = served.current()

    first, *rest = model_replies(state, card)
    with TensorStreamReceiver() as rx:
        rx.consume(rest)
        arrays = rx.arrays()

    assert first.WhichOneof("part") == "card_json"
    assert ModelCard.from_json(first.card_json, "reply") == card
    assert all(np.array_equal(arrays[n], state[n]) for n in state)


def test_the_final_model_is_written_where_asked_and_loads(tmp_path):
    model, served, params = _served()
    served.publish(params, 4, 0.75, 0.5)

    assert served.write(None) is None
    path = served.write(tmp_path)

    assert path == tmp_path / "model.safetensors"
    assert (tmp_path / "model.json").exists()
    loaded = load_model(path).state_dict()
    assert all(np.array_equal(loaded[n].numpy(), params[n]) for n in params)
