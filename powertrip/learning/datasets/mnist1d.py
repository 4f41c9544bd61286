"""MNIST-1D, the embedded default workload: generated offline by the ``mnist1d`` package (the
project may not ship or download real data) and cached as .npz."""

from __future__ import annotations

import os
import random
import zipfile
import zlib
from pathlib import Path

import numpy as np

from powertrip.learning.datasets.progress import report
from powertrip.learning.datasets.record import Dataset, check_fraction, default_cache_dir
from powertrip.learning.device import tensor

__all__ = ["load_mnist1d"]


def _generate_mnist1d(num_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Run the mnist1d generator without leaking its global-RNG reseeding into the caller."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = seed
    args.train_split = 1.0  # we split ourselves, so the cache is independent of test_fraction
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        data = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    x = np.concatenate([data["x"], data["x_test"]]).astype(np.float32)
    y = np.concatenate([data["y"], data["y_test"]]).astype(np.int64)
    return x, y


def load_mnist1d(
    num_samples: int = 20000,
    test_fraction: float = 0.2,
    seed: int = 0,
    cache_dir: Path | None = None,
) -> Dataset:
    """Generate (or load from cache) the synthetic MNIST-1D dataset.

    x has shape [n, 1, 40], standardised to zero mean and unit variance (the generator already
    does this over the whole set). The generator shuffles, so the last `test_fraction` of the
    samples is the test set, which reproduces mnist1d's own 80/20 split for the default.
    `num_samples` is rounded down to a multiple of 10 (equal samples per class).
    """
    check_fraction(test_fraction)
    if num_samples < 20:
        raise ValueError(f"num_samples must be >= 20, got {num_samples}")
    cache_dir = default_cache_dir() if cache_dir is None else Path(cache_dir)
    cache_file = cache_dir / f"mnist1d_n{num_samples}_seed{seed}_v1.npz"
    x = y = None
    if cache_file.is_file():
        try:
            with np.load(cache_file) as cached:
                x, y = cached["x"], cached["y"]
        except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error):
            x = y = None  # corrupt cache (e.g. an interrupted write elsewhere): regenerate
    if x is None or y is None:
        note = f"mnist1d: generating {num_samples} samples (cached after)"
        report(0, 1, note)  # one call into the generator: no step in between to report
        x, y = _generate_mnist1d(num_samples, seed)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f"{cache_file.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, x=x, y=y)
        os.replace(tmp, cache_file)  # atomic: parallel workers never read a half-written file
        report(1, 1, note)
    n_test = min(max(1, round(len(y) * test_fraction)), len(y) - 1)
    x_t = tensor(np.ascontiguousarray(x, dtype=np.float32)).unsqueeze(1)
    y_t = tensor(np.ascontiguousarray(y, dtype=np.int64))
    split = len(y) - n_test
    return Dataset(
        name="mnist1d",
        task="image",
        x_train=x_t[:split],
        y_train=y_t[:split],
        x_test=x_t[split:],
        y_test=y_t[split:],
        num_classes=10,
        groups_train=None,
        synthetic=True,
    )
