"""The one device <-> host boundary: every crossing between torch tensors (on any device) and
numpy arrays, or from a device back to host memory, goes through these functions.

Models train wherever ``resolve_device`` says (CUDA when present); FedAvg (Eq. 2), checkpoints
and the wire work on numpy. A tensor on a GPU cannot be viewed as numpy, so a stray
``tensor.numpy()`` works on a CPU machine and crashes on a GPU one. Keeping every crossing here
means CUDA works everywhere or nowhere, and a test that scans the package for crossings
elsewhere (``tests/unit/test_device_boundary.py``) keeps it so on a CPU-only CI.

On the CPU nothing is copied unless asked: tensors and arrays share memory, which is what the
emulator's bit-identical results rely on.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from powertrip.fedavg import NumpyParams

__all__ = [
    "TorchParams",
    "array",
    "resolve_device",
    "row_to_numpy",
    "tensor",
    "to_host",
    "to_numpy",
    "to_torch",
]

#: A model as torch tensors by parameter name (``NumpyParams`` is the numpy form).
TorchParams = dict[str, torch.Tensor]


def resolve_device(preferred: str = "auto") -> torch.device:
    """``auto``: CUDA when available, else CPU; anything else is passed to ``torch.device``."""
    if preferred == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(preferred)


def to_numpy(params: Mapping[str, torch.Tensor], *, copy: bool = False) -> NumpyParams:
    """Host numpy arrays of ``params``. Without ``copy``, CPU tensors are viewed, not copied, so
    the caller must not mutate the arrays while the tensors are in use."""
    return {k: array(v, copy=copy) for k, v in params.items()}


def array(tensor: torch.Tensor, *, copy: bool = False) -> NDArray:
    """One tensor as a host numpy array: a view of a CPU tensor unless ``copy``; a tensor on
    another device is always copied (once)."""
    out = tensor.detach().cpu().numpy()
    return out.copy() if copy and tensor.device.type == "cpu" else out


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """One tensor in host memory, still a tensor (itself when it already is on the CPU): for
    results gathered once per batch of sites rather than once per site."""
    return tensor.detach().cpu()


def to_torch(
    params: Mapping[str, ArrayLike], device: torch.device | str | None = None
) -> TorchParams:
    """Torch tensors of ``params`` on ``device`` (CPU when None): shared memory on the CPU."""
    return {k: tensor(v, device) for k, v in params.items()}


def tensor(data: ArrayLike, device: torch.device | str | None = None) -> torch.Tensor:
    """One host array as a tensor on ``device``; on the CPU it shares the array's memory."""
    t = torch.from_numpy(np.asarray(data))
    return t if device is None else t.to(device)


def row_to_numpy(stacked: Mapping[str, torch.Tensor], j: int) -> NumpyParams:
    """Site ``j``'s slice of a batched result (every tensor stacked along dim 0), as numpy."""
    return {k: array(v[j]) for k, v in stacked.items()}
