"""``int4``: symmetric 4-bit integers in [-7, 7], two to a byte, one float32 absmax scale per
block of 256 entries (each entry off by at most scale/2)."""

from __future__ import annotations

import math

import numpy as np

from powertrip.codecs.base import Codec, Payload
from powertrip.codecs.blocks import absmax_scales, blocks, n_blocks, quantize, unblocks

QMAX = 7


class Int4Codec(Codec):
    name = "int4"

    def encode(self, x: np.ndarray) -> Payload:
        rows, n = blocks(x)
        scale = absmax_scales(rows, QMAX)
        q = quantize(rows, scale, QMAX)[:n]
        nibbles = (q + 8).astype(np.uint8)  # 1..15
        if n % 2:
            nibbles = np.append(nibbles, np.uint8(0))
        packed = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)
        return Payload(np.shape(x), {"codes": packed, "scales": scale})

    def decode(self, payload: Payload) -> np.ndarray:
        packed, scale = payload.parts["codes"], payload.parts["scales"]
        n = math.prod(payload.shape)  # the entries (the codes hold a padding nibble when odd)
        nibbles = np.empty(packed.size * 2, dtype=np.int16)
        nibbles[0::2] = packed & 0x0F
        nibbles[1::2] = packed >> 4
        return unblocks(nibbles[:n] - 8, scale, n, payload.shape)

    def bytes_for(self, size: int) -> int:
        return -(-size // 2) + 4 * n_blocks(size)
