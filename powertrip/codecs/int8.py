"""``int8``: symmetric 8-bit integers with one float32 absmax scale per block of 256 entries
(round to nearest, so each entry is off by at most scale/2)."""

from __future__ import annotations

from powertrip.codecs.blocks import IntBlockCodec, n_blocks


class Int8Codec(IntBlockCodec):
    name = "int8"
    qmax = 127

    def bytes_for(self, size: int) -> int:
        return size + 4 * n_blocks(size)
