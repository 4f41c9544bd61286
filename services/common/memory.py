"""Process-level memory settings for services that stream large tensors.

glibc raises its mmap threshold after the first large free, after which the multi-MiB chunk,
spool and fold buffers of concurrent uploads come from per-thread arenas that keep their peak
resident; on 8 concurrent 256 MiB uploads that alone took the aggregator from about 2.2x to
3.5x the model size (benchmarks/bench_upload_rss.py). Pinning the threshold keeps such buffers
in mmap, returned to the kernel on free.

Pinning the threshold also fixes glibc's trim threshold at its 128 KiB default, so every free of
a sub-MiB chunk buffer at the top of a heap gave its pages back and the next chunk faulted them
in again (~2 GB/s on a 2-core VM instead of ~14): ``pin_mmap_threshold`` keeps up to
``trim_bytes`` free at the top of each heap instead. 1 MiB (two 512 KiB chunks) is the measured
compromise: one 256 MiB upload ran ~40 % faster than at 128 KiB; 4 MiB ran faster still but
took 8 concurrent uploads to 2.45x the model, too close to the 2.5x bound (benchmarks/README.md,
upload).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)
M_MMAP_THRESHOLD = -3  # mallopt parameter number (malloc.h)
M_TRIM_THRESHOLD = -1


def pin_mmap_threshold(nbytes: int = 1 << 20, trim_bytes: int = 1 << 20) -> bool:
    """Serve allocations of ``nbytes`` or more by mmap, and keep up to ``trim_bytes`` free at
    the top of a heap before returning it; False where glibc is not in use."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        ok = (
            libc is not None
            and bool(libc.mallopt(M_MMAP_THRESHOLD, nbytes))
            and bool(libc.mallopt(M_TRIM_THRESHOLD, trim_bytes))
        )
    except (OSError, AttributeError):
        ok = False
    if not ok:
        logger.info("mallopt unavailable: allocator defaults kept")
    return ok
