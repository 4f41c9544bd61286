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

import re
from collections.abc import Mapping

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from powertrip.learning.params import NumpyParams

__all__ = [
    "TorchParams",
    "array",
    "device_name",
    "host_rows",
    "resolve_device",
    "row_to_numpy",
    "scalar",
    "tensor",
    "to_host",
    "to_numpy",
    "to_torch",
]


#: A model as torch tensors by parameter name (``NumpyParams`` is the numpy form).
TorchParams = dict[str, torch.Tensor]


#: what ``--device`` / ``POWERTRIP_DEVICE`` accept (``meta``: shape-only, for the boundary tests)
DEVICE_PATTERN = re.compile(r"auto|cpu|meta|cuda(:\d+)?")


def device_name(preferred: str | torch.device) -> str:
    """``preferred`` lower-cased, if it names a device ``resolve_device`` knows (ValueError
    naming the choices if not), without asking whether this machine has it: a configuration
    written for a GPU node stays valid config on a CPU-only CI."""
    text = str(preferred).strip().lower()
    if not DEVICE_PATTERN.fullmatch(text):
        raise ValueError(f"device {str(preferred)!r}: use auto, cpu, cuda or cuda:N")
    return text


def resolve_device(preferred: str | torch.device = "auto") -> torch.device:
    """The device a run trains on, checked once where the user names it: ``auto`` (CUDA when
    available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``. ``cuda`` gets its index, so tensor
    and trainer devices compare equal. ValueError, naming the choices, for anything else or for
    a GPU this machine does not have (better at start than at the first round)."""
    text = device_name(preferred)
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    if not text.startswith("cuda"):
        return torch.device(text)
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(
            f"device {str(preferred)!r}: CUDA is not available (torch {torch.__version__}, "
            f"{build}); use auto or cpu"
        )
    device = torch.device(text)
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {text!r}: this machine has {torch.cuda.device_count()} GPU(s)")
    return torch.device("cuda", index)


def to_numpy(params: Mapping[str, torch.Tensor], *, copy: bool = False) -> NumpyParams:
    """Host numpy arrays of ``params``. Without ``copy``, CPU tensors are viewed, not copied, so
    the caller must not mutate the arrays while the tensors are in use."""
    return {k: array(v, copy=copy) for k, v in params.items()}


def array(tensor: torch.Tensor, *, copy: bool = False) -> NDArray:
    """One tensor as a host numpy array: a view of a CPU tensor unless ``copy``; a tensor on
    another device is always copied (once)."""
    out = _host(tensor).numpy()
    return out.copy() if copy and tensor.device.type == "cpu" else out


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """One tensor in host memory, still a tensor (itself when it already is on the CPU): for
    results gathered once per batch of sites rather than once per site."""
    return _host(tensor)


def scalar(tensor: torch.Tensor) -> float:
    """A one-element tensor as a Python number, read once (a GPU sync) after the work that made
    it, e.g. an evaluation's summed loss; float64 is exact for float32 sums and int64 counts."""
    return float(_host(tensor))


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """The one device -> host copy every crossing above makes (the boundary tests replace it to
    give shape-only ``meta`` tensors stand-in host values)."""
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


def host_rows(params: Mapping[str, torch.Tensor], k: int) -> TorchParams:
    """k rows of every tensor in host memory, for a batched round's results: views of one
    [k, P] matrix when the model has one dtype (``powertrip.aggregation.fold_rows``: the fold then
    reads
    whole rows), else one buffer per tensor. Row j of each view is contiguous."""
    dtypes = {p.dtype for p in params.values()}
    if len(dtypes) != 1:
        return {n: torch.empty((k, *p.shape), dtype=p.dtype) for n, p in params.items()}
    matrix = torch.empty((k, sum(p.numel() for p in params.values())), dtype=dtypes.pop())
    views, off = {}, 0
    for name, p in params.items():
        views[name] = matrix[:, off : off + p.numel()].view(k, *p.shape)
        off += p.numel()
    return views
