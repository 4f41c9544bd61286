"""Update codecs: how a site's update (its pseudo-gradient, ``w_i - w``) is squeezed onto the wire.

Each codec lives in its own module and registers itself here; ``get_codec(name)`` builds one by
name (``"int8"``, ``"topk-10"``...). A codec encodes one tensor (a float32 ``np.ndarray``) into
a payload, decodes it back, and counts the payload's exact bytes on the wire (values, scales,
indices and a shape header). ``ratio(sizes)`` is those bytes over the fp32 bytes of the same
tensors: the factor the selection and the time model apply to the update size M.

Error feedback is written once (``compress``): ``e = delta + residual; c = encode(e);
residual = e - decode(c)``, so what a lossy codec drops one round is sent in a later one
(docs/compression.md). ``ErrorFeedback`` applies it for every upload path, whole
(``apply``: the emulator's decoded update; ``encode``: a worker's payload), per-rank shards
(``encode_shards``: each shard coded on its own, one residual for the site) and curtailment
sub-rounds alike, keeping each site's residual in the caller's ``SiteStateBook``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import EllipsisType
from typing import TYPE_CHECKING

import numpy as np

from powertrip.codecs.base import Codec, Payload

if TYPE_CHECKING:  # the book loads torch; listing or building a codec does not
    from powertrip.learning.state_book import RoundKey, SiteStateBook

__all__ = ["Codec", "ErrorFeedback", "Payload", "codec_names", "get_codec", "register"]
__all__ += ["PART", "Compressed", "compress", "roundtrip", "wire_parts"]

#: a payload part's tensor name on the wire: ``"<tensor>#<part>"``
PART = "#"

#: name (or name prefix, for ``topk-<p>``) -> factory taking the name's parameter ("" if none),
#: or where a built-in one lives ("module:attribute", imported on first use: listing the names
#: imports no codec, so ``--help`` stays light).
_REGISTRY: dict[str, Callable[[str], Codec] | str] = {
    "none": "powertrip.codecs.none:NoCodec",
    "int8": "powertrip.codecs.int8:Int8Codec",
    "int4": "powertrip.codecs.int4:Int4Codec",
    "fp8": "powertrip.codecs.fp8:Fp8Codec",
    "topk-": "powertrip.codecs.topk:_topk",
}


def register(name: str, factory: Callable[[str], Codec]) -> None:
    """Add a codec; a ``name`` ending in ``-`` is a family (``topk-`` takes ``topk-<p>``)."""
    _REGISTRY[name] = factory


def codec_names() -> list[str]:
    """The registered names, a family written with its parameter (``topk-<p>``)."""
    return sorted(f"{n}<p>" if n.endswith("-") else n for n in _REGISTRY)


def get_codec(name: str) -> Codec:
    """The codec called ``name``; an unknown name raises ValueError naming the known ones."""
    if name in _REGISTRY and not name.endswith("-"):
        return _factory(name)("")
    for prefix in _REGISTRY:
        if prefix.endswith("-") and name.startswith(prefix) and len(name) > len(prefix):
            return _factory(prefix)(name[len(prefix) :])
    raise ValueError(f"unknown codec {name!r}; known: {', '.join(codec_names())}")


def _factory(name: str) -> Callable[[str], Codec]:
    """The factory registered as ``name``, importing a built-in codec's module on first use."""
    entry = _REGISTRY[name]
    if isinstance(entry, str):
        module, _, attribute = entry.partition(":")
        built = getattr(importlib.import_module(module), attribute)
        # a built-in codec class takes no parameter; a family's factory takes the name's
        entry = built if name.endswith("-") else (lambda _param, cls=built: cls())
        _REGISTRY[name] = entry
    return entry


def roundtrip(codec: Codec, x: np.ndarray) -> tuple[np.ndarray, int]:
    """``decode(encode(x))`` and the payload's wire bytes."""
    payload = codec.encode(x)
    return codec.decode(payload), codec.wire_bytes(payload)


@dataclass(frozen=True)
class Compressed:
    """One update through a codec: each tensor's payload, what the server decodes, the
    residual the site carries on (None: no error feedback) and the bytes on the wire."""

    payloads: dict[str, Payload]
    decoded: dict[str, np.ndarray]
    residual: dict[str, np.ndarray] | None
    wire_bytes: int


def compress(
    codec: Codec,
    delta: Mapping[str, np.ndarray],
    residual: Mapping[str, np.ndarray] | None = None,
    feedback: bool = True,
) -> Compressed:
    """``delta`` coded with error feedback: each tensor sent as ``encode(delta + residual)``
    and the new residual what that drops (``feedback=False``: the delta alone, no residual).
    Tensors of ``residual`` not in ``delta`` carry over."""
    own = dict(residual or {}) if feedback else None
    payloads, decoded, nbytes = {}, {}, 0
    for name, d in delta.items():
        d = np.asarray(d, dtype=np.float32)
        e = d + own[name] if own is not None and name in own else d
        payload = codec.encode(e)
        out = codec.decode(payload)
        if own is not None:
            own[name] = e - out
        payloads[name], decoded[name] = payload, out.astype(d.dtype, copy=False)
        nbytes += codec.wire_bytes(payload)
    return Compressed(payloads, decoded, own, nbytes)


def wire_parts(payloads: Mapping[str, Payload]) -> dict[str, np.ndarray]:
    """The payloads' arrays as the tensors of a stream, ``"<tensor>#<part>"`` each."""
    return {
        f"{name}{PART}{part}": np.ascontiguousarray(a)
        for name, p in payloads.items()
        for part, a in p.parts.items()
    }


class ErrorFeedback:
    """A run's codec over its sites' updates, each site's residual kept in ``book`` (a fresh
    one when none is given): ``apply`` (the update as the server decodes it), ``encode`` (the
    payload a worker sends) and ``encode_shards`` (one payload per rank's shard); ``enabled``
    False codes every update without feedback. Counts the bytes it sent."""

    def __init__(
        self, codec: Codec, enabled: bool = True, book: SiteStateBook | None = None
    ) -> None:
        if book is None:
            from powertrip.learning.state_book import SiteStateBook

            book = SiteStateBook()
        self.codec = codec
        self.enabled = enabled
        self.book = book
        self.wire_bytes = 0
        self.raw_bytes = 0

    def _compress(
        self, site: int, delta: Mapping[str, np.ndarray], key: RoundKey | None
    ) -> Compressed:
        got = compress(self.codec, delta, self.book.residual(site, key), self.enabled)
        self.book.update(site, key, residual=got.residual if self.enabled else {})
        self.wire_bytes += got.wire_bytes
        self.raw_bytes += sum(np.size(d) * 4 for d in delta.values())
        return got

    def apply(
        self, site: int, delta: Mapping[str, np.ndarray], key: RoundKey | None = None
    ) -> dict[str, np.ndarray]:
        """The update as the server decodes it; the site's residual after round ``key``
        (None: its newest round) is updated."""
        return self._compress(site, delta, key).decoded

    def encode(
        self, site: int, delta: Mapping[str, np.ndarray], key: RoundKey | None = None
    ) -> dict[str, np.ndarray]:
        """The payload's parts a worker sends for ``delta`` (``wire_parts``), as ``apply``."""
        return wire_parts(self._compress(site, delta, key).payloads)

    def encode_shards(
        self, site: int, delta: Mapping[str, np.ndarray], count: int, key: RoundKey | None = None
    ) -> list[dict[str, np.ndarray]]:
        """``delta`` cut into ``count`` per-rank shards (rows ``shard_rows(dim0, count, i)`` of
        every tensor, 0-d tensors in shard 0), each coded on its own with its rows of the
        site's one residual, which is updated as a whole: the shards' payloads, in order."""
        residual = self.book.residual(site, key) or {}
        new = {n: np.array(r, np.float32) for n, r in residual.items()}  # rows written below
        out = []
        for i in range(count):
            index = {n: r for n, d in delta.items() if (r := _rows(d, count, i)) is not None}
            shard = {n: np.asarray(delta[n])[r] for n, r in index.items()}
            mine = {n: residual[n][index[n]] for n in shard if n in residual}
            got = compress(self.codec, shard, mine, self.enabled)
            for n, r in index.items():
                if got.residual is not None:
                    new.setdefault(n, np.zeros(np.shape(delta[n]), np.float32))[r] = got.residual[n]
            out.append(wire_parts(got.payloads))
            self.wire_bytes += got.wire_bytes
        self.raw_bytes += sum(np.size(d) * 4 for d in delta.values())
        self.book.update(site, key, residual=new if self.enabled else {})
        return out

    @property
    def residuals(self) -> dict[int, dict[str, np.ndarray]]:
        """Each site's newest residual."""
        return {s: dict(e.residual or {}) for s, e in self.book.latest().items()}

    def residual_norm(self, sites: Iterable[int] | None = None) -> float:
        residuals = self.residuals
        keys = residuals if sites is None else sites
        sq = sum(float(np.sum(r * r)) for s in keys for r in residuals.get(s, {}).values())
        return sq**0.5


def _rows(d: np.ndarray, count: int, index: int) -> slice | EllipsisType | None:
    """The index of shard ``index`` of ``count`` in ``d`` (None: not in that shard)."""
    from powertrip.learning.shards import shard_rows  # listing codecs (--help) needs no learning

    if np.ndim(d) == 0:
        return ... if index == 0 else None
    lo, hi = shard_rows(np.shape(d)[0], count, index)
    return slice(lo, hi)
