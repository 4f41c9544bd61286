"""The record every loader returns, its error type, and the train/test split they share.

Bad input raises ``DatasetError`` whose message names the file (and record/line where known):
a study that silently trains on half a file is worse than one that refuses to start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["Dataset", "DatasetError", "check_fraction", "default_cache_dir", "split_indices"]


class DatasetError(ValueError):
    """A dataset is missing or malformed; the message names the file (and where in it)."""


@dataclass(frozen=True, eq=False)  # eq=False: tensors have no truth value
class Dataset:
    """A train/test split plus the natural grouping the federated partitioner may use."""

    name: str  # "mnist1d", "mnist", "emnist", "shakespeare"
    task: str  # "image", "next-char" or "audio"
    x_train: torch.Tensor  # float32 [n, C, L] / [n, 1, H, W]; int64 [n, seq_len] for chars;
    # float32 [n, frames, n_mels] log-mel for audio
    y_train: torch.Tensor  # int64 [n]
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    groups_train: np.ndarray | None  # natural group id per training sample, else None
    group_names: tuple[str, ...] = ()  # name per group id
    synthetic: bool = False  # True for generated data (mnist1d)
    #: lm with a subword tokenizer: UTF-8 bytes the validation targets (y_test) spell, for
    #: bits per byte (lm_eval's ``num_bytes``); None: one byte per token
    val_bytes: int | None = None
    tokenizer_sha256: str | None = None  # lm with a BPE: the sha256 of its saved JSON

    @property
    def in_shape(self) -> tuple[int, ...]:
        """Shape of one input sample (what `models.build_model` needs)."""
        return tuple(self.x_train.shape[1:])


def check_fraction(test_fraction: float) -> None:
    """Refuse a test fraction that would leave the train or the test side empty."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")


def split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random train/test split of n samples; both sides get at least one sample."""
    check_fraction(test_fraction)
    if n < 2:
        raise ValueError(f"need at least 2 samples to split into train and test, got {n}")
    n_test = min(max(1, round(n * test_fraction)), n - 1)
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


#: the one environment variable the library reads (services know it: services/env_names.py)
CACHE_DIR_VARIABLE = "POWERTRIP_CACHE_DIR"


def default_cache_dir() -> Path:
    """Where generated or trained dataset artefacts are cached (``POWERTRIP_CACHE_DIR``)."""
    return Path(os.environ.get(CACHE_DIR_VARIABLE, "~/.cache/powertrip")).expanduser()
