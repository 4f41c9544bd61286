"""Keyword Transformer (KWT, Berg et al., Interspeech 2021) for the PowerTrip paper's
keyword-spotting workload (a transformer on Speech Commands, §5.1, Table 2).

KWT treats each time frame of a log-mel spectrogram as a token: a linear patch embedding of the
frame's mel bins, a learned class token, learned positional embeddings, pre-LayerNorm encoder
blocks (multi-head self-attention, GELU MLP) and a LayerNorm + linear head on the class token.

Written for the batched trainer, which stacks every site's parameters and runs
``vmap(grad(loss))`` over ``torch.func.functional_call``: no buffers, no dropout (random
state), nothing in place, no data-dependent control flow, and attention written out with
matmul + softmax (``nn.MultiheadAttention`` and ``scaled_dot_product_attention`` have no vmap
batching rule; torch would fall back to a per-site loop).

Sizes are named (``KWT_SIZES``): ``tiny`` (22 k parameters) trains on a CPU in minutes; ``kwt1``
to ``kwt3`` are the paper's KWT-1/2/3 (0.6 M, 2.4 M, 5.4 M).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from powertrip.learning.shapes import named_shape

__all__ = ["KWT", "KWT_SIZES", "KWTShape", "kwt_shape"]


@dataclass(frozen=True)
class KWTShape:
    dim: int  # token width
    depth: int  # encoder blocks
    heads: int  # attention heads; dim must be a multiple
    mlp_dim: int  # hidden width of each block's MLP

    def __post_init__(self) -> None:
        if min(self.dim, self.depth, self.heads, self.mlp_dim) < 1:
            raise ValueError(f"every KWT size field must be >= 1, got {self}")
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not a multiple of heads {self.heads}")


#: tiny: the CPU size used by the studies here; kwt1-3: Berg et al.'s Table 1 (depth 12).
KWT_SIZES: dict[str, KWTShape] = {
    "tiny": KWTShape(dim=32, depth=2, heads=2, mlp_dim=64),
    "kwt1": KWTShape(dim=64, depth=12, heads=1, mlp_dim=256),
    "kwt2": KWTShape(dim=128, depth=12, heads=2, mlp_dim=512),
    "kwt3": KWTShape(dim=192, depth=12, heads=3, mlp_dim=768),
}


def kwt_shape(size: str | None = None, **overrides: int | None) -> KWTShape:
    """A named size (default ``tiny``) with the non-None fields of ``overrides`` on top."""
    return named_shape(KWT_SIZES, size, "KWT", **overrides)


class EncoderBlock(nn.Module):
    """Pre-norm block: x + MHSA(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, shape: KWTShape) -> None:
        super().__init__()
        self.heads = shape.heads
        self.ln1 = nn.LayerNorm(shape.dim)
        self.qkv = nn.Linear(shape.dim, 3 * shape.dim)
        self.proj = nn.Linear(shape.dim, shape.dim)
        self.ln2 = nn.LayerNorm(shape.dim)
        self.fc = nn.Linear(shape.dim, shape.mlp_dim)
        self.out = nn.Linear(shape.mlp_dim, shape.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class KWT(nn.Module):
    """Class logits [B, classes] for log-mel frames [B, frames, n_mels]."""

    def __init__(
        self, num_classes: int, frames: int, n_mels: int, shape: KWTShape | None = None
    ) -> None:
        super().__init__()
        self.shape = shape or kwt_shape()
        dim = self.shape.dim
        self.embed = nn.Linear(n_mels, dim)  # the patch is one whole frame (KWT's 1 x n_mels)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.empty(1, frames + 1, dim))
        nn.init.trunc_normal_(self.pos, std=0.02)
        self.blocks = nn.ModuleList(EncoderBlock(self.shape) for _ in range(self.shape.depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x)
        cls = self.cls.expand(tokens.shape[0], -1, -1)
        h = torch.cat([cls, tokens], dim=1) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h[:, 0]))
