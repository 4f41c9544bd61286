"""MNIST and EMNIST from IDX files in the run's dataset path (which one the files hold: ten
labels are MNIST, more EMNIST), with LEAF's FEMNIST CNN (``models.CNN2D``, the paper's)."""

from __future__ import annotations

from torch import nn

from powertrip.learning.custom import RunSettings
from powertrip.learning.datasets import Dataset, load_idx
from powertrip.learning.models import build_model
from powertrip.learning.workloads import builtin, dataset_path


def _data(run: RunSettings, seed: int) -> Dataset:
    return load_idx(dataset_path(run), seed=seed)


def _model(data: Dataset) -> nn.Module:
    return build_model("cnn2d", data.num_classes, data.in_shape)


MNIST = builtin("mnist", "handwritten digits (IDX files), the paper's CNN", _data, _model)
EMNIST = builtin("emnist", "handwritten characters (IDX files), the paper's CNN", _data, _model)
