"""The emulator's memo of trained rounds: a round's outcome depends only on the selection
history that led to it (for one federation and seed), so runs of different policies that pick
the same sites share the training (``powertrip.rounds.emulate``)."""

from __future__ import annotations

import hashlib

import numpy as np

from powertrip.rounds.loop import RoundOutcome

__all__ = ["TrajectoryCache", "chain_key"]


class TrajectoryCache:
    """Memo of (selection history -> trained round), valid for one federation and seed.

    Bounded by entries and by bytes of stored parameters, so a large model (EMNIST's CNN is
    26 MB a copy) stops filling it instead of exhausting memory; a full cache only costs speed.
    """

    def __init__(self, max_entries: int = 20_000, max_bytes: int = 512 * 2**20) -> None:
        self._entries: dict[bytes, RoundOutcome] = {}
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: bytes) -> RoundOutcome | None:
        hit = self._entries.get(key)
        if hit is None:
            self.misses += 1
        else:
            self.hits += 1
        return hit

    def put(self, key: bytes, value: RoundOutcome) -> None:
        """Keep (or replace) ``key``'s round if it fits."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= _nbytes(old)
        size = _nbytes(value)
        if len(self._entries) < self.max_entries and self.bytes + size <= self.max_bytes:
            self._entries[key] = value
            self.bytes += size


def _nbytes(outcome: RoundOutcome) -> int:
    """Bytes of the stored models: the new global one and a deferred split-half probe's."""
    size = sum(t.numel() * t.element_size() for t in outcome.params.values())
    extra = (*(outcome.half_params or {}).values(), *(outcome.outer_state or {}).values())
    return size + sum(a.nbytes for a in extra)


def chain_key(key: bytes, selected: np.ndarray) -> bytes:
    return hashlib.blake2b(
        key + np.sort(selected).astype(np.int64).tobytes(), digest_size=16
    ).digest()
