"""``fp8``: float8 e4m3 (torch.float8_e4m3fn, max 448) with one float32 absmax scale per block
of 256 entries, so each block's largest entry maps to 448; relative error <= 2^-4 per entry
above e4m3's subnormal range."""

from __future__ import annotations

import numpy as np
import torch

from powertrip.codecs.base import Codec, Payload
from powertrip.codecs.blocks import absmax_scales, blocks, n_blocks, unblocks
from powertrip.learning.device import array, tensor

FP8_MAX = 448.0


class Fp8Codec(Codec):
    name = "fp8"

    def encode(self, x: np.ndarray) -> Payload:
        rows, n = blocks(x)
        scale = absmax_scales(rows, 1) / np.float32(FP8_MAX)
        scale[scale == 0] = 1.0
        scaled = tensor(rows / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX)
        codes = array(scaled.to(torch.float8_e4m3fn).view(torch.uint8)).ravel()[:n]
        return Payload(np.shape(x), {"codes": codes.copy(), "scales": scale.astype(np.float32)})

    def decode(self, payload: Payload) -> np.ndarray:
        codes, scale = payload.parts["codes"], payload.parts["scales"]
        n = codes.size
        values = array(tensor(codes).view(torch.float8_e4m3fn).to(torch.float32))
        return unblocks(values, scale, n, payload.shape)

    def bytes_for(self, size: int) -> int:
        return size + 4 * n_blocks(size)
