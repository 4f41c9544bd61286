"""Update codecs on the wire (docs/compression.md, "Over the services").

The aggregator assigns the run's codec (``codec`` of the run's configuration, sent to every
worker); a worker never chooses. The worker encodes each site's update with it
(``powertrip.codecs.ErrorFeedback``: an error-feedback residual per site, kept in the host's
``SiteStateBook``, when the run asks for one) and sends the payload's parts as an ordinary
tensor stream, one tensor ``"<tensor>#<part>"`` per part (int8 codes, fp32 scales, uint32
indices...), whole or one stream per rank's shard, naming the codec in its update header.
``codec="none"`` sends the raw tensors exactly as before.

The aggregator treats every byte as hostile: from the model's shapes and the codec it knows the
exact layout of a valid payload (``coded_specs``: names, dtypes, sizes), so the stream is
bounded by the codec's exact wire size before a byte is read, and ``decode_update`` checks what
the values may not be (top-k indices out of range or repeated, a non-finite result).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from powertrip.codecs import PART, Codec, Payload
from powertrip.services.common.tensor_stream import StreamError, TensorSpec

__all__ = ["DecodedUpdate", "coded_specs", "decode_update", "wire_codec"]

NONE = "none"


def wire_codec(name: str) -> str:
    """The codec an update header names ("" is none: the header as it was before codecs)."""
    return name or NONE


def _template(codec: Codec, shape: tuple[int, ...]) -> Payload:
    # every codec's layout (part names, dtypes, sizes, meta) depends on the shape alone
    return codec.encode(np.zeros(shape, dtype=np.float32))


def coded_specs(model: Sequence[TensorSpec], codec: Codec) -> list[TensorSpec]:
    """The exact tensor stream a valid payload of ``model``'s tensors is under ``codec``."""
    out = []
    for s in model:
        for part, a in _template(codec, s.shape).parts.items():
            out.append(TensorSpec(f"{s.name}{PART}{part}", tuple(a.shape), a.dtype.name))
    return out


def _bad(field: str, problem: str) -> StreamError:
    return StreamError("codec_payload", f"tensor {field!r} {problem}")


def decode_update(
    model: Sequence[TensorSpec], codec: Codec, parts: Mapping[str, NDArray]
) -> dict[str, NDArray[np.float32]]:
    """The update a verified coded stream (``parts``, laid out as ``coded_specs``) holds;
    StreamError naming the tensor when its values are not a payload the codec could produce."""
    out = {}
    for s in model:
        template = _template(codec, s.shape)
        got = {p: parts[f"{s.name}{PART}{p}"] for p in template.parts}
        idx = got.get("indices")
        if idx is not None and idx.size:
            n = int(np.prod(s.shape, dtype=np.int64))
            if int(idx.max()) >= n:
                raise _bad(f"{s.name}{PART}indices", f"holds an index >= {n} (the tensor's size)")
            if idx.size > 1 and not bool(np.all(np.diff(idx.astype(np.int64)) > 0)):
                raise _bad(f"{s.name}{PART}indices", "is not strictly increasing")
        values = codec.decode(Payload(template.shape, got, template.meta))
        values = np.asarray(values, dtype=np.float32).reshape(s.shape)
        if not bool(np.isfinite(values).all()):
            raise _bad(s.name, "decodes to NaN or Inf")
        out[s.name] = values
    return out


class DecodedUpdate:
    """A decoded update where the collector takes a verified receiver: ``pieces``, ``arrays``,
    ``close``; ``total_bytes`` is what crossed the wire (the coded stream)."""

    def __init__(self, arrays: dict[str, NDArray[np.float32]], wire_bytes: int) -> None:
        self._arrays = arrays
        self.total_bytes = wire_bytes
        self.complete = True

    def pieces(self, piece_bytes: int = 0) -> Iterator[tuple[str, int, NDArray]]:
        for name, a in self._arrays.items():
            yield name, 0, a.reshape(-1)

    def arrays(self) -> dict[str, NDArray[np.float32]]:
        return self._arrays

    def close(self) -> None:
        pass
