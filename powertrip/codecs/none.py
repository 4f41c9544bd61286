"""``none``: the fp32 update as is (the reference; a run with it is the uncompressed one)."""

from __future__ import annotations

import numpy as np

from powertrip.codecs.base import Codec, Payload


class NoCodec(Codec):
    name = "none"
    lossless = True

    def encode(self, x: np.ndarray) -> Payload:
        return Payload(x.shape, {"values": np.asarray(x, dtype=np.float32).ravel()})

    def decode(self, payload: Payload) -> np.ndarray:
        return payload.parts["values"].reshape(payload.shape)

    def bytes_for(self, size: int) -> int:
        return 4 * size

    def ratio(self, shapes=None) -> float:  # noqa: ANN001 - fp32 is the unit, headers aside
        return 1.0
