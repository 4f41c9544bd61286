"""Dataset loaders for the worker and the emulator (pure: no grpc, no network).

Every loader returns the same ``Dataset`` record (``record``), so partitioning, models and the
trainer never care where the data came from. Each built-in workload calls its own loader
(``powertrip.learning.workloads``):

* ``mnist1d``: generated offline by the ``mnist1d`` package and cached (the embedded default).
* ``idx``: MNIST / EMNIST from IDX files (plain or .gz) in a directory the user provides.
* ``shakespeare``: LEAF-style next-character prediction, one natural group per speaking role.
* ``lm`` (``text``): language-model windows of a text file (bytes) or a .npy of token ids;
  without a path, an embedded synthetic corpus.
* ``speech-commands``, ``fsdd`` (``speech``): spoken words as log-mel frames, one natural group
  per speaker (keyword spotting).

Host arrays become tensors through ``learning.device``.
"""

from __future__ import annotations

from powertrip.learning.datasets.idx import load_idx
from powertrip.learning.datasets.mnist1d import load_mnist1d
from powertrip.learning.datasets.record import Dataset, DatasetError
from powertrip.learning.datasets.shakespeare import (
    LEAF_VOCAB,
    decode_chars,
    encode_chars,
    load_shakespeare,
)
from powertrip.learning.datasets.speech import load_speech
from powertrip.learning.datasets.text import load_text

__all__ = [
    "LEAF_VOCAB",
    "Dataset",
    "DatasetError",
    "decode_chars",
    "encode_chars",
    "load_idx",
    "load_mnist1d",
    "load_shakespeare",
    "load_speech",
    "load_text",
]
