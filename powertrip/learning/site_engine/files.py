"""What a site's parent and its ranks share on disk (in the group's own temporary directory):
the site's token data, written once and memory-mapped by every rank, and two flat float32
files of named tensors, the global model a round starts from and the update it ends with.

A file is mapped, not pickled: the global model crosses to N ranks without N copies through
pipes, and each rank writes its own rows of the update (``shard_rows``) straight into the page
cache the parent reads, so the update is never gathered on one rank.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from powertrip.learning.device import array, tensor

__all__ = [
    "Layout",
    "TensorFile",
    "layout_of",
    "load_tokens",
    "memory_dir",
    "nbytes",
    "save_tokens",
]

#: (name, shape) of every tensor, in the model's ``named_parameters`` order
Layout = tuple[tuple[str, tuple[int, ...]], ...]


def layout_of(named: Sequence[tuple[str, torch.Tensor]]) -> Layout:
    return tuple((n, tuple(int(d) for d in t.shape)) for n, t in named)


class TensorFile:
    """Named float32 tensors laid end to end in one file, viewed through a shared mapping:
    a write by one process is seen by every process that mapped the file."""

    def __init__(self, path: str | Path, layout: Layout, create: bool = False) -> None:
        self.path = Path(path)
        self.layout = layout
        total = sum(math.prod(shape) for _, shape in layout)
        if create:
            with open(self.path, "wb") as f:
                f.truncate(max(total, 1) * 4)
        flat = np.memmap(self.path, dtype=np.float32, mode="r+", shape=(max(total, 1),))
        self._flat: np.memmap | None = flat
        self.tensors: dict[str, torch.Tensor] = {}
        flat_t = tensor(flat)
        offset = 0
        for name, shape in layout:
            size = math.prod(shape)
            self.tensors[name] = flat_t[offset : offset + size].view(shape)
            offset += size

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def write(self, params: Mapping[str, torch.Tensor]) -> None:
        """Copy ``params`` (same names and shapes as the layout, any float dtype) in."""
        check_layout(params, self.layout)
        for name, t in self.tensors.items():
            t.copy_(params[name])

    def close(self) -> None:
        self.tensors = {}
        self._flat = None


def check_layout(params: Mapping[str, torch.Tensor], layout: Layout) -> None:
    """ValueError naming the first name or shape of ``params`` that is not the model's."""
    expected = dict(layout)
    if set(params) != set(expected):
        missing = sorted(set(expected) - set(params))[:3]
        extra = sorted(set(params) - set(expected))[:3]
        raise ValueError(f"global params do not match the model: missing {missing}, extra {extra}")
    for name, shape in expected.items():
        if tuple(params[name].shape) != shape:
            raise ValueError(
                f"global param {name!r} has shape {tuple(params[name].shape)}, the model {shape}"
            )


def save_tokens(directory: Path, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor) -> int:
    """The site's samples as ``x.npy``/``y.npy`` in ``directory`` (their row count)."""
    xs, ys = (array(v) if isinstance(v, torch.Tensor) else np.asarray(v) for v in (x, y))
    if xs.shape[0] != ys.shape[0] or xs.shape[0] == 0:
        raise ValueError(f"x and y need the same, non-zero number of rows: {xs.shape}, {ys.shape}")
    if not np.issubdtype(ys.dtype, np.integer):
        raise ValueError(f"y must hold integer targets (token ids, labels), got {ys.dtype}")
    for name, v in (("x", xs), ("y", ys)):
        np.save(directory / f"{name}.npy", v)
    return int(xs.shape[0])


def load_tokens(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read-only memory maps of the site's ``x`` and ``y``."""
    x, y = (np.load(directory / f"{n}.npy", mmap_mode="r") for n in ("x", "y"))
    return x, y


def nbytes(a: np.ndarray | torch.Tensor) -> int:
    return a.numel() * a.element_size() if isinstance(a, torch.Tensor) else a.nbytes


def memory_dir(need: int) -> str | None:
    """``/dev/shm`` when it can hold twice ``need`` bytes (the files then never reach a disk),
    else the system's temporary directory (None)."""
    shm = Path("/dev/shm")
    try:
        return str(shm) if shutil.disk_usage(shm).free > 2 * need else None
    except OSError:
        return None
