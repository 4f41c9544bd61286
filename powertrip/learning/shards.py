"""How a site's update splits into per-rank shards: FSDP2's even split along dim 0.

A site trained by N ranks sends N streams, one per rank, each holding rows
``shard_rows(n, N, i)`` of every tensor (0-d tensors travel whole in shard 0). The worker's
ranks cut their shards with it and the aggregator checks every shard against it, so the layout
is defined once and a peer cannot choose it.
"""

from __future__ import annotations

__all__ = ["shard_rows"]


def shard_rows(dim0: int, count: int, index: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of a dim-0 of ``dim0`` rows held by shard ``index`` of ``count``:
    ``torch.chunk``'s layout (chunks of ceil(dim0 / count) rows; the last ones may be shorter
    or empty), which is how ``fully_shard`` places parameters on ranks."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard {index} of {count} does not exist")
    if dim0 < 0:
        raise ValueError(f"dim 0 of {dim0} rows")
    step = -(-dim0 // count) if dim0 else 0
    lo = min(index * step, dim0)
    return lo, min(lo + step, dim0)
