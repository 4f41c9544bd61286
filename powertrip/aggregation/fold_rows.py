"""A batched round's updates as one [sites, parameters] matrix, so ``StreamingFedAvg.add_rows``
reads each update byte in a handful of whole-matrix BLAS passes instead of several small calls
per tensor (the emulator's fold: a 100 x 24 KiB round is ~60 calls per tensor layout against 4).

The emulator's trainer writes a round's deltas into one preallocated row-major buffer and hands
out each tensor as a view of its column block (``powertrip.learning.device.host_rows``);
``shared_matrix`` recognises that layout from the views alone, so rows stacked any other way
still fold, on the per-tensor path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from powertrip.learning.params import NumpyParams

__all__ = ["dense_direction", "row_sq_norms", "shared_matrix"]


def shared_matrix(stacked: NumpyParams, names: Sequence[str]) -> NDArray | None:
    """The [k, P] matrix ``stacked``'s tensors are consecutive column blocks of (in ``names``'
    order, each row-contiguous), or None when they are laid out any other way."""
    arrays = [np.asarray(stacked[n]) for n in names]
    if not arrays or arrays[0].ndim == 0:
        return None
    first = arrays[0]
    k, item, dtype, row_stride = first.shape[0], first.itemsize, first.dtype, first.strides[0]
    cursor = start = first.__array_interface__["data"][0]
    for a in arrays:
        if a.ndim == 0 or a.shape[0] != k or a.dtype != dtype or not _rows_contiguous(a):
            return None
        if (k > 1 and a.strides[0] != row_stride) or a.__array_interface__["data"][0] != cursor:
            return None
        cursor += (a.size // k if k else 0) * item
    width = (cursor - start) // item
    row_stride = row_stride if k > 1 else width * item  # rows may be strided (``[::2]``)
    if k == 0 or row_stride < width * item:
        return None
    return np.lib.stride_tricks.as_strided(
        first, shape=(k, width), strides=(row_stride, item), writeable=False
    )


def _rows_contiguous(a: NDArray) -> bool:
    """Whether each ``a[j]`` is one C-ordered run of memory."""
    expected = a.itemsize
    for size, stride in zip(reversed(a.shape[1:]), reversed(a.strides[1:]), strict=True):
        if size > 1 and stride != expected:
            return False
        expected *= size
    return True


def row_sq_norms(matrix: NDArray) -> NDArray[np.float64]:
    """Each row's squared norm: one batched dot product (BLAS), about 3x ``einsum``'s speed."""
    rows = matrix[:, None, :]
    return np.matmul(rows, matrix[:, :, None]).reshape(-1).astype(np.float64)


def dense_direction(
    direction: NumpyParams, shapes: dict[str, tuple[int, ...]], stride: int, dtype: np.dtype
) -> NDArray:
    """The sketched unit direction spread over a full row: tensor by tensor, its values at every
    ``stride``-th coordinate and zeros elsewhere, so a row's projection is one dense product."""
    total = sum(math.prod(s) for s in shapes.values())
    out, off = np.zeros(total, dtype=dtype), 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        sampled = out[off : off + n : stride]
        sampled[:] = direction[name][: sampled.size]
        off += n
    return out
