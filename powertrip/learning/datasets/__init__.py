"""Dataset loaders for the worker and the emulator (pure: no grpc, no network).

Every loader returns the same ``Dataset`` record (``record``), so partitioning, models and the
trainer never care where the data came from:

* ``mnist1d``: generated offline by the ``mnist1d`` package and cached (the embedded default).
* ``idx``: MNIST / EMNIST from IDX files (plain or .gz) in a directory the user provides.
* ``shakespeare``: LEAF-style next-character prediction, one natural group per speaking role.
* ``lm`` (``text``): language-model windows of a text file (bytes) or a .npy of token ids;
  without a path, an embedded synthetic corpus.
* ``speech-commands``, ``fsdd`` (``speech``): spoken words as log-mel frames, one natural group
  per speaker (keyword spotting).

``load_dataset`` picks one by name. Host arrays become tensors through ``learning.device``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from powertrip.learning.datasets.idx import load_idx
from powertrip.learning.datasets.mnist1d import load_mnist1d
from powertrip.learning.datasets.record import Dataset, DatasetError
from powertrip.learning.datasets.shakespeare import (
    LEAF_VOCAB,
    decode_chars,
    encode_chars,
    load_shakespeare,
)
from powertrip.learning.datasets.speech import SPEECH_DATASETS, load_speech
from powertrip.learning.datasets.text import load_text

__all__ = [
    "DATASET_NAMES",
    "LEAF_VOCAB",
    "Dataset",
    "DatasetError",
    "decode_chars",
    "encode_chars",
    "load_dataset",
    "load_idx",
    "load_mnist1d",
    "load_shakespeare",
    "load_speech",
    "load_text",
]

DATASET_NAMES = ("mnist1d", "mnist", "emnist", "shakespeare", "lm", *SPEECH_DATASETS)


def load_dataset(name: str, path: Path | None = None, **kwargs: Any) -> Dataset:
    """Load a dataset by name; `path` is required for everything but the generated mnist1d."""
    if name not in DATASET_NAMES:
        raise DatasetError(f"unknown dataset {name!r}; valid names: {', '.join(DATASET_NAMES)}")
    if name == "mnist1d":
        return load_mnist1d(**kwargs)
    if name == "lm":  # a path is optional: the synthetic corpus
        return load_text(None if path is None else Path(path), **kwargs)
    if path is None:
        raise DatasetError(f"dataset {name!r} needs a path to its files")
    if name == "shakespeare":
        return load_shakespeare(Path(path), **kwargs)
    if name in SPEECH_DATASETS:
        return load_speech(Path(path), name, **kwargs)
    return load_idx(Path(path), **kwargs)
