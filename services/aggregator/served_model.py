"""The run's current global model as the aggregator hands it out: streamed by ``GetModel`` to an
operator (``powertrip model pull``) and written as a model file when the run ends, both in the
one format of ``powertrip.learning.model_file`` (the ``state_dict`` plus its card).

Both modes publish the model after every round that changed it, with that round's number,
accuracy and loss, so a pull always gets weights and a card that belong together (the round
loop moves on while a pull streams the previous round's arrays, which no round writes into).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from numpy.typing import NDArray
from torch import nn

from powertrip.learning.model_file import ModelCard, StateLayout, save_model
from powertrip.learning.params import NumpyParams
from powertrip.services.common.tensor_stream import encode, wrap_tensor_stream
from powertrip.v1 import aggregator_pb2

logger = logging.getLogger(__name__)

#: the run's final model in its checkpoint directory: NAME.safetensors and NAME.json
FINAL_NAME = "model"


class ServedModel:
    """The latest published model and its card, read whole under a lock."""

    def __init__(self, model: nn.Module, params: NumpyParams, card: ModelCard) -> None:
        self._layout = StateLayout(model, params)
        self._lock = threading.Lock()
        self._params, self._card = params, card

    def publish(
        self, params: NumpyParams, round_index: int, accuracy: float | None, loss: float | None
    ) -> None:
        """``params`` (never written into afterwards) as the model after ``round_index``."""
        card = replace(self._card, round=round_index, accuracy=accuracy, loss=loss)
        with self._lock:
            self._params, self._card = params, card

    def current(self) -> tuple[dict[str, NDArray], ModelCard]:
        """The whole ``state_dict`` as arrays, and its card."""
        with self._lock:
            params, card = self._params, self._card
        return self._layout.full(params), card

    def write(self, directory: Path | None) -> Path | None:
        """The current model as ``directory/model.safetensors`` + ``model.json`` (None: no
        directory, or it could not be written: said in the log, the run's end stands)."""
        if directory is None:
            return None
        state, card = self.current()
        try:
            path = save_model(directory / FINAL_NAME, state, card)
        except OSError as exc:
            logger.error("final model not written to %s: %s", directory, exc)
            return None
        logger.info("final model (round %d) written to %s", card.round, path)
        return path


def model_replies(
    state: dict[str, NDArray], card: ModelCard
) -> Iterator[aggregator_pb2.GetModelReply]:
    """``GetModel``'s replies: the card, then the tensors (one chunk in memory at a time)."""
    yield aggregator_pb2.GetModelReply(card_json=card.to_json())
    yield from wrap_tensor_stream(encode(state), aggregator_pb2.GetModelReply)
