"""bfloat16 on the wire without a bfloat16 dtype: numpy has none, so a bf16 tensor travels as
its raw little-endian uint16 bit patterns (dtype name ``"bfloat16"`` in its ``TensorSpec``), the
top half of the float32 bits. Narrowing rounds to nearest, ties to even (what torch's
``.to(torch.bfloat16)`` does); widening is exact (``bits << 16``). Everything works block by
block, so no float32 copy of a whole tensor is ever made on either side.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["BF16", "BLOCK", "all_finite_bf16", "bf16_bits", "widen_into"]

BF16 = "bfloat16"
#: elements per block of the narrowing (its uint32 temporaries stay a few MiB)
BLOCK = 1 << 20
_EXPONENT = 0x7F80  # all ones: inf or NaN
_NAN = 0x7FC0  # a quiet NaN


def bf16_bits(a: NDArray[np.float32]) -> NDArray[np.uint16]:
    """``a`` rounded to bfloat16, as little-endian uint16 bits of ``a``'s shape.

    Round to nearest even: add 0x7FFF plus the lowest kept bit, keep the top 16 bits (a value
    above bfloat16's largest finite becomes inf, as in torch); a NaN becomes the quiet NaN
    0x7FC0 (torch keeps other NaN bits; the receiver refuses either)."""
    src = np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint32)
    out = np.empty(a.shape, dtype=np.dtype("<u2"))
    flat = out.reshape(-1)
    for i in range(0, src.size, BLOCK):
        bits = src[i : i + BLOCK]
        r = bits >> 16
        r &= 1
        r += 0x7FFF
        r += bits  # NaN payloads may wrap here; they are replaced below
        r >>= 16
        flat[i : i + BLOCK] = r
        nan = (bits & 0x7FFFFFFF) > 0x7F800000
        if nan.any():
            flat[i : i + BLOCK][nan] = _NAN
    return out


def widen_into(bits: NDArray[np.uint16], out: NDArray[np.uint32]) -> NDArray[np.float32]:
    """``bits`` widened to float32 exactly, written into ``out`` (a reused buffer of the same
    size); returns ``out`` seen as float32."""
    np.left_shift(bits, 16, out=out, dtype=np.uint32)
    return out.view(np.float32)


def all_finite_bf16(bits: NDArray[np.uint16]) -> bool:
    """No inf or NaN: no value has every exponent bit set."""
    if bits.size == 0:
        return True
    return int(np.bitwise_and(bits, _EXPONENT).max()) != _EXPONENT
