"""The Codec interface and the payload it produces."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

#: bytes of a payload's shape header: one uint32 per dimension plus one for the rank
HEADER_BYTES_PER_DIM = 4


@dataclass(frozen=True)
class Payload:
    """One encoded tensor: its shape and the arrays that go on the wire (``parts``); ``meta``
    holds anything fixed by the codec's name (never sent)."""

    shape: tuple[int, ...]
    parts: dict[str, np.ndarray]
    meta: dict[str, object] = field(default_factory=dict)


def header_bytes(shape: tuple[int, ...]) -> int:
    return HEADER_BYTES_PER_DIM * (len(shape) + 1)


class Codec(ABC):
    """Encodes one float32 tensor. ``wire_bytes`` is exact: the payload's arrays as packed
    (4-bit codes two to a byte) plus the shape header."""

    name: str = ""
    lossless: bool = False

    @abstractmethod
    def encode(self, x: np.ndarray) -> Payload: ...

    @abstractmethod
    def decode(self, payload: Payload) -> np.ndarray: ...

    def wire_bytes(self, payload: Payload) -> int:
        return header_bytes(payload.shape) + sum(int(a.nbytes) for a in payload.parts.values())

    @abstractmethod
    def bytes_for(self, size: int) -> int:
        """Bytes of a tensor of ``size`` entries on the wire, without the shape header (the
        same as ``wire_bytes(encode(x)) - header`` for any ``x`` of that size)."""

    def ratio(self, shapes: Iterable[tuple[int, ...]] | None = None) -> float:
        """Wire bytes over fp32 bytes for tensors of ``shapes`` (headers included); with none,
        the limit for one large tensor (headers and partial blocks vanish)."""
        if shapes is None:
            n = 1 << 30
            return self.bytes_for(n) / (4 * n)
        shapes = [tuple(s) for s in shapes]
        sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        wire = sum(self.bytes_for(n) + header_bytes(s) for n, s in zip(sizes, shapes, strict=True))
        return wire / (4 * sum(sizes)) if sum(sizes) else 1.0
