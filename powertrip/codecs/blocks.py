"""Per-block absmax scaling shared by the block codecs (int8, int4, fp8): split into blocks,
scale, quantize, and the way back; ``IntBlockCodec``, the integer codecs' encode and decode."""

from __future__ import annotations

import math

import numpy as np

from powertrip.codecs.base import Codec, Payload

BLOCK = 256  # entries per scale (one float32 scale each)


def blocks(x: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, int]:
    """``x`` flattened into rows of ``block`` (the last zero-padded) and its size."""
    flat = np.asarray(x, dtype=np.float32).ravel()
    n = flat.size
    rows = -(-n // block)
    padded = np.zeros(rows * block, dtype=np.float32)
    padded[:n] = flat
    return padded.reshape(rows, block), n


def absmax_scales(rows: np.ndarray, qmax: int) -> np.ndarray:
    """One float32 scale per row: absmax / qmax (1 for an all-zero row)."""
    amax = np.abs(rows).max(axis=1) if rows.size else np.zeros(0, np.float32)
    scale = (amax / qmax).astype(np.float32)
    scale[scale == 0] = 1.0
    return scale


def n_blocks(size: int, block: int = BLOCK) -> int:
    return -(-size // block)


def quantize(rows: np.ndarray, scale: np.ndarray, qmax: int) -> np.ndarray:
    """Each entry over its row's scale, rounded to the nearest integer in [-qmax, qmax]: int8,
    flattened (padding included)."""
    return np.clip(np.rint(rows / scale[:, None]), -qmax, qmax).astype(np.int8).ravel()


def unblocks(values: np.ndarray, scale: np.ndarray, n: int, shape: tuple[int, ...]) -> np.ndarray:
    """The inverse of ``blocks``: the first n ``values`` times their block's scale, in ``shape``."""
    padded = np.zeros(scale.size * BLOCK, dtype=np.float32)
    padded[:n] = values[:n]
    return (padded.reshape(-1, BLOCK) * scale[:, None]).ravel()[:n].reshape(shape)


class IntBlockCodec(Codec):
    """Symmetric integers in [-qmax, qmax], one float32 absmax scale per block of ``BLOCK``
    entries (round to nearest: each entry off by at most scale/2). The codes are stored by
    ``pack`` (as they are unless a codec packs them tighter) and read back by ``unpack``."""

    qmax: int

    def encode(self, x: np.ndarray) -> Payload:
        rows, n = blocks(x)
        scale = absmax_scales(rows, self.qmax)
        codes = self.pack(quantize(rows, scale, self.qmax)[:n])
        return Payload(np.shape(x), {"codes": codes, "scales": scale})

    def decode(self, payload: Payload) -> np.ndarray:
        n = math.prod(payload.shape)
        values = self.unpack(payload.parts["codes"], n)
        return unblocks(values, payload.parts["scales"], n, payload.shape)

    def pack(self, q: np.ndarray) -> np.ndarray:
        """The wire form of the ``n`` integer codes ``q`` (int8)."""
        return q

    def unpack(self, codes: np.ndarray, n: int) -> np.ndarray:
        """The ``n`` integer codes back from their wire form."""
        return codes
