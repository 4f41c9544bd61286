"""``int4``: symmetric 4-bit integers in [-7, 7], two to a byte, one float32 absmax scale per
block of 256 entries (each entry off by at most scale/2)."""

from __future__ import annotations

import numpy as np

from powertrip.codecs.blocks import IntBlockCodec, n_blocks


class Int4Codec(IntBlockCodec):
    name = "int4"
    qmax = 7

    def pack(self, q: np.ndarray) -> np.ndarray:
        """Two codes a byte, each shifted to 1..15 (a zero nibble pads an odd count)."""
        nibbles = (q + 8).astype(np.uint8)
        if q.size % 2:
            nibbles = np.append(nibbles, np.uint8(0))
        return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)

    def unpack(self, codes: np.ndarray, n: int) -> np.ndarray:
        nibbles = np.empty(codes.size * 2, dtype=np.int16)
        nibbles[0::2] = codes & 0x0F
        nibbles[1::2] = codes >> 4
        return nibbles[:n] - 8

    def bytes_for(self, size: int) -> int:
        return -(-size // 2) + 4 * n_blocks(size)
