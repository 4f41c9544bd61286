"""Keyword spotting: Speech Commands or FSDD clips in the run's dataset path as log-mel frames,
one natural group per speaker; the Keyword Transformer (``kwt.KWT``)."""

from __future__ import annotations

from torch import nn

from powertrip.learning.custom import RunSettings
from powertrip.learning.datasets import Dataset, load_speech
from powertrip.learning.models import build_model
from powertrip.learning.workloads import builtin, dataset_path


def _data(run: RunSettings, seed: int) -> Dataset:
    return load_speech(dataset_path(run), run.workload, seed=seed)


def _model(data: Dataset) -> nn.Module:
    return build_model("kwt", data.num_classes, data.in_shape)


SPEECH_COMMANDS = builtin("speech-commands", "spoken words by speaker, a KWT", _data, _model)
FSDD = builtin("fsdd", "spoken digits by speaker, a KWT", _data, _model)
