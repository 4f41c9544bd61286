"""LEAF's Shakespeare: next-character prediction over the run's text(s), one natural group per
speaking role, at most ``num_samples`` windows; the two-layer LSTM (``models.CharLSTM``)."""

from __future__ import annotations

from torch import nn

from powertrip.learning.custom import RunSettings
from powertrip.learning.datasets import Dataset, load_shakespeare
from powertrip.learning.models import build_model
from powertrip.learning.workloads import builtin, dataset_path


def _data(run: RunSettings, seed: int) -> Dataset:
    return load_shakespeare(dataset_path(run), max_samples=run.num_samples, seed=seed)


def _model(data: Dataset) -> nn.Module:
    return build_model("lstm", data.num_classes, data.in_shape)


SHAKESPEARE = builtin("shakespeare", "next character by speaking role, an LSTM", _data, _model)
