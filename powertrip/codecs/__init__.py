"""Update codecs: how a site's update (its pseudo-gradient, ``w_i - w``) is squeezed onto the wire.

Each codec lives in its own module and registers itself here; ``get_codec(name)`` builds one by
name (``"int8"``, ``"topk-10"``...). A codec encodes one tensor (a float32 ``np.ndarray``) into
a payload, decodes it back, and counts the payload's exact bytes on the wire (values, scales,
indices and a shape header). ``ratio(sizes)`` is those bytes over the fp32 bytes of the same
tensors: the factor the selection and the time model apply to the update size M.

Error feedback (``ErrorFeedback``) is kept by the caller, one residual per site and tensor:
``e = delta + residual; c = encode(e); residual = e - decode(c)``, so what a lossy codec drops
one round is sent in a later one (docs/compression.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from powertrip.codecs.base import Codec, Payload

__all__ = ["Codec", "ErrorFeedback", "Payload", "codec_names", "get_codec", "register"]
__all__ += ["roundtrip"]

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


class ErrorFeedback:
    """Per-site residuals for one run: ``apply`` compresses a site's update with error feedback
    (or without, ``enabled=False``) and counts the bytes it sent."""

    def __init__(self, codec: Codec, enabled: bool = True) -> None:
        self.codec = codec
        self.enabled = enabled
        self.residuals: dict[int, dict[str, np.ndarray]] = {}
        self.wire_bytes = 0
        self.raw_bytes = 0

    def apply(self, site: int, delta: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The update as the server decodes it; the site's residual is updated."""
        own = self.residuals.setdefault(site, {})
        out = {}
        for name, d in delta.items():
            d = np.asarray(d, dtype=np.float32)
            e = d + own[name] if self.enabled and name in own else d
            decoded, nbytes = roundtrip(self.codec, e)
            if self.enabled:
                own[name] = e - decoded
            out[name] = decoded.astype(d.dtype, copy=False)
            self.wire_bytes += nbytes
            self.raw_bytes += d.size * 4
        return out

    def residual_norm(self, sites: Iterable[int] | None = None) -> float:
        keys = self.residuals if sites is None else sites
        sq = sum(float(np.sum(r * r)) for s in keys for r in self.residuals.get(s, {}).values())
        return sq**0.5
