"""``topk-<p>``: the k = ceil(p% of n) entries of largest magnitude (ties broken by index),
sent as uint32 indices plus float32 values; everything else decodes to zero. Meant to run with
error feedback, which sends the dropped mass in later rounds."""

from __future__ import annotations

import math

import numpy as np

from powertrip.codecs.base import Codec, Payload


class TopKCodec(Codec):
    def __init__(self, percent: float) -> None:
        if not 0 < percent <= 100:
            raise ValueError(f"topk-<p> needs 0 < p <= 100, got {percent!r}")
        self.percent = percent
        self.name = f"topk-{percent:g}"

    def k(self, size: int) -> int:
        return min(size, max(1, math.ceil(size * self.percent / 100))) if size else 0

    def encode(self, x: np.ndarray) -> Payload:
        flat = np.asarray(x, dtype=np.float32).ravel()
        k = self.k(flat.size)
        if k == flat.size:
            idx = np.arange(k, dtype=np.uint32)
        else:
            # stable: among equal magnitudes the lower index wins
            order = np.argsort(-np.abs(flat), kind="stable")[:k]
            idx = np.sort(order).astype(np.uint32)
        return Payload(np.shape(x), {"indices": idx, "values": flat[idx]})

    def decode(self, payload: Payload) -> np.ndarray:
        out = np.zeros(int(np.prod(payload.shape, dtype=np.int64)), dtype=np.float32)
        out[payload.parts["indices"]] = payload.parts["values"]
        return out.reshape(payload.shape)

    def bytes_for(self, size: int) -> int:
        return 8 * self.k(size)


def _topk(param: str) -> TopKCodec:
    try:
        percent = float(param)
    except ValueError:
        raise ValueError(f"topk-<p> needs a number p (percent), got topk-{param}") from None
    return TopKCodec(percent)
