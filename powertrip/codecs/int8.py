"""``int8``: symmetric 8-bit integers with one float32 absmax scale per block of 256 entries
(round to nearest, so each entry is off by at most scale/2)."""

from __future__ import annotations

import numpy as np

from powertrip.codecs.base import Codec, Payload
from powertrip.codecs.blocks import absmax_scales, blocks, n_blocks, quantize, unblocks

QMAX = 127


class Int8Codec(Codec):
    name = "int8"

    def encode(self, x: np.ndarray) -> Payload:
        rows, n = blocks(x)
        scale = absmax_scales(rows, QMAX)
        return Payload(np.shape(x), {"codes": quantize(rows, scale, QMAX)[:n], "scales": scale})

    def decode(self, payload: Payload) -> np.ndarray:
        q, scale = payload.parts["codes"], payload.parts["scales"]
        return unblocks(q, scale, q.size, payload.shape)

    def bytes_for(self, size: int) -> int:
        return size + 4 * n_blocks(size)
