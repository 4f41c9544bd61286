"""The pre-LayerNorm transformer block of the transformer workloads (``gpt``'s causal decoder,
``kwt``'s encoder) and the check their size tables share.

Written for the batched trainer, which stacks every site's parameters and runs
``vmap(grad(loss))`` over ``torch.func.functional_call``: no buffers, no dropout (random state),
nothing in place, and attention written out with matmul + softmax, because
``scaled_dot_product_attention`` has no vmap batching rule (torch would fall back to a per-site
loop). A model that is not vmapped may ask for the fused kernel (``fused=True``): same logits,
less memory and time.
"""

from __future__ import annotations

import math
from dataclasses import astuple
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["Block", "check_size"]


def check_size(shape: DataclassInstance, what: str, width: str, heads: str) -> None:
    """ValueError unless every field of ``shape`` is >= 1 and its ``width`` field splits evenly
    into its ``heads`` field (each head attends over ``width / heads`` channels)."""
    if min(astuple(shape)) < 1:
        raise ValueError(f"every {what} size field must be >= 1, got {shape}")
    w, h = getattr(shape, width), getattr(shape, heads)
    if w % h:
        raise ValueError(f"{width} {w} is not a multiple of {heads} {h}")


class Block(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x)), the MLP ``width -> hidden -> width`` with GELU.

    ``gpt2_layers``: GPT-2's initialisation for a stack of that many blocks (weights N(0, 0.02),
    zero biases, the residual writes shrunk with depth); None keeps torch's defaults.
    """

    def __init__(
        self,
        width: int,
        heads: int,
        hidden: int,
        gpt2_layers: int | None = None,
        fused: bool = False,
    ) -> None:
        super().__init__()
        self.heads = heads
        self.fused = fused
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, hidden)
        self.out = nn.Linear(hidden, width)
        if gpt2_layers is not None:
            for layer in (self.qkv, self.proj, self.fc, self.out):
                nn.init.normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)
            for layer in (self.proj, self.out):  # residual writes shrink with depth
                nn.init.normal_(layer.weight, std=0.02 / math.sqrt(2 * gpt2_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mask``: a [T, T] bool of the positions each may attend to (the causal one; the
        fused kernel builds its own), None for full attention."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=mask is not None)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
            if mask is not None:
                att = att.masked_fill(~mask, float("-inf"))
            y = att.softmax(dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))
