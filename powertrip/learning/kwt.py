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

from dataclasses import dataclass

import torch
from torch import nn

from powertrip.learning.shapes import named_shape
from powertrip.learning.transformer import Block, check_size

__all__ = ["KWT", "KWT_SIZES", "KWTShape", "kwt_shape"]


@dataclass(frozen=True)
class KWTShape:
    dim: int  # token width
    depth: int  # encoder blocks
    heads: int  # attention heads; dim must be a multiple
    mlp_dim: int  # hidden width of each block's MLP

    def __post_init__(self) -> None:
        check_size(self, "KWT", width="dim", heads="heads")


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
        self.blocks = nn.ModuleList(
            Block(dim, self.shape.heads, self.shape.mlp_dim) for _ in range(self.shape.depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x)
        cls = self.cls.expand(tokens.shape[0], -1, -1)
        h = torch.cat([cls, tokens], dim=1) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h[:, 0]))
