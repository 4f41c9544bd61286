"""Per-block absmax scaling shared by the integer codecs."""

from __future__ import annotations

import numpy as np

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
