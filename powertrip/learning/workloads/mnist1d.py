"""MNIST-1D: ten digit templates as 40-point signals, generated offline (no dataset path), the
run's ``num_samples`` of them; a small 1-D CNN (``models.CNN1D``)."""

from __future__ import annotations

from torch import nn

from powertrip.learning.custom import RunSettings
from powertrip.learning.datasets import Dataset, load_mnist1d
from powertrip.learning.models import build_model
from powertrip.learning.workloads import builtin


def _data(run: RunSettings, seed: int) -> Dataset:
    return load_mnist1d(num_samples=run.num_samples, seed=seed)


def _model(data: Dataset) -> nn.Module:
    return build_model("cnn1d", data.num_classes, data.in_shape)


MNIST1D = builtin("mnist1d", "synthetic 1-D digits, a small CNN", _data, _model)
