"""How one step's batch splits over a site's ranks, and how each rank weighs its samples so
that the ranks' averaged gradient is exactly the one-process mean over the batch.

Rank ``r`` of ``N`` takes positions ``[r*c, (r+1)*c)`` of the step's ``B`` (``c = ceil(B/N)``,
the batch padded with -1 to ``N*c``). Padding gets weight 0 and a stand-in row (shapes stay
fixed, so every rank runs the same kernels and the same collectives); a real sample gets
``N / valid`` where ``valid`` counts the real samples of the whole batch. DDP and FSDP average
gradients over ranks (divide by N), so the sum of the ranks' weighted losses, averaged, is the
batch's mean loss: also for a short last batch, and whichever rank holds its padding.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from powertrip.learning.shards import shard_rows

__all__ = ["check_rows", "rank_share", "split_shards"]


def rank_share(row: np.ndarray, world: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s sample indices (padding replaced by a real row) and their float32 loss
    weights, for one step's batch ``row`` of sample indices (-1: padding)."""
    b = row.shape[0]
    c = -(-b // world)
    padded = np.full(world * c, -1, dtype=np.int64)
    padded[:b] = row
    mine = padded[rank * c : (rank + 1) * c]
    valid = mine >= 0
    total = int((row >= 0).sum())
    if total == 0:
        raise ValueError("a step without a real sample")
    stand_in = int(row[row >= 0][0])
    weights = np.where(valid, np.float32(world) / np.float32(total), np.float32(0.0))
    return np.where(valid, mine, stand_in), weights.astype(np.float32)


def check_rows(rows: np.ndarray, n: int) -> np.ndarray:
    """``rows`` as int64 [steps, B]: ValueError unless every entry is -1 or a row of the site's
    ``n`` samples and every step has at least one real sample."""
    r = np.asarray(rows)
    if r.ndim != 2 or r.shape[0] == 0 or r.shape[1] == 0:
        raise ValueError(f"rows must be [steps, batch] with both > 0, got shape {r.shape}")
    if not np.issubdtype(r.dtype, np.integer):
        raise ValueError(f"rows must be integer sample indices, got {r.dtype}")
    r = r.astype(np.int64, copy=False)
    if r.min() < -1 or r.max() >= n:
        raise ValueError(f"rows must be -1 (padding) or in [0, {n}), got [{r.min()}, {r.max()}]")
    empty = np.flatnonzero((r >= 0).sum(1) == 0)
    if empty.size:
        raise ValueError(f"step {int(empty[0])} has no real sample")
    return r


def split_shards(delta: Mapping[str, torch.Tensor], count: int) -> tuple[dict, ...]:
    """Views of ``delta``'s rows each rank owns (``shard_rows``; 0-d tensors in shard 0)."""
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(count)]
    for name, t in delta.items():
        for i in range(count):
            if t.dim() == 0:
                if i == 0:
                    out[0][name] = t
                continue
            lo, hi = shard_rows(t.shape[0], count, i)
            out[i][name] = t[lo:hi]
    return tuple(out)
