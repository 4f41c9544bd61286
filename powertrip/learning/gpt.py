"""A decoder-only transformer language model (GPT-2 layout: pre-LayerNorm blocks, learned
positions, GELU MLP, output head tied to the token embedding), written for the batched trainer.

The trainer stacks every site's parameters and runs ``vmap(grad(loss))`` over
``torch.func.functional_call``, so the model keeps no buffers and does nothing in place: the
causal mask is built in ``forward`` (a registered mask would be a buffer), there is no dropout
(random state), and attention is written out with matmuls because ``scaled_dot_product_attention``
has no vmap batching rule (torch falls back to a per-site loop); a model that is not vmapped (a
plain training loop, evaluation) can ask for it with ``fused_attention=True``, same logits,
less memory and time. The head reuses the embedding
matrix through ``F.linear`` instead of sharing a ``Parameter``, so every name in
``named_parameters`` is one tensor that FedAvg, checkpoints and the wire can treat alike.

Sizes are named (``GPT_SIZES``) and any field can be overridden; the smallest is ~1 M parameters
and trains on a CPU, ``xl`` is the curtailment paper's 561 M scale and needs a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from powertrip.learning.shapes import named_shape

__all__ = ["GPT", "GPT_SIZES", "GPTShape", "gpt_shape"]


@dataclass(frozen=True)
class GPTShape:
    n_layer: int
    n_head: int
    d_model: int
    context_length: int

    def __post_init__(self) -> None:
        if min(self.n_layer, self.n_head, self.d_model, self.context_length) < 1:
            raise ValueError(f"every GPT size field must be >= 1, got {self}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_head {self.n_head}")


#: tiny ~1 M (CPU), small ~11 M (nanoGPT's Shakespeare model), medium ~85 M (GPT-2 small's
#: body), large ~300 M, xl ~570 M (the curtailment paper pretrains a 561 M model).
GPT_SIZES: dict[str, GPTShape] = {
    "tiny": GPTShape(n_layer=5, n_head=4, d_model=128, context_length=64),
    "small": GPTShape(n_layer=6, n_head=6, d_model=384, context_length=256),
    "medium": GPTShape(n_layer=12, n_head=12, d_model=768, context_length=1024),
    "large": GPTShape(n_layer=24, n_head=16, d_model=1024, context_length=1024),
    "xl": GPTShape(n_layer=20, n_head=16, d_model=1536, context_length=1024),
}


def gpt_shape(size: str | None = None, **overrides: int | None) -> GPTShape:
    """A named size (default ``tiny``) with the non-None fields of ``overrides`` on top."""
    return named_shape(GPT_SIZES, size, "model", **overrides)


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, n_layer: int, fused: bool = False) -> None:
        super().__init__()
        self.n_head = n_head
        self.fused = fused
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)
        for layer in (self.qkv, self.proj, self.fc, self.out):
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)
        for layer in (self.proj, self.out):  # GPT-2: residual writes shrink with depth
            nn.init.normal_(layer.weight, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_head)
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Next-token logits [B, T, vocab] for every position of token ids [B, T] (T <= context).

    ``fused_attention``: ``scaled_dot_product_attention`` instead of explicit matmuls; only for
    a model that is not vmapped (the batched trainer keeps the default).
    """

    def __init__(self, vocab_size: int, shape: GPTShape, fused_attention: bool = False) -> None:
        super().__init__()
        self.shape = shape
        self.tok = nn.Embedding(vocab_size, shape.d_model)
        self.pos = nn.Embedding(shape.context_length, shape.d_model)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.blocks = nn.ModuleList(
            Block(shape.d_model, shape.n_head, shape.n_layer, fused_attention)
            for _ in range(shape.n_layer)
        )
        self.ln_f = nn.LayerNorm(shape.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[-1]
        if t > self.shape.context_length:
            raise ValueError(
                f"sequence of {t} tokens exceeds the context {self.shape.context_length}"
            )
        x = self.tok(idx) + self.pos.weight[:t]
        mask = torch.ones(t, t, dtype=torch.bool, device=idx.device).tril()  # computed: no buffer
        # (built even when fused: cheap, and the blocks keep one signature)
        for block in self.blocks:
            x = block(x, mask)
        return F.linear(self.ln_f(x), self.tok.weight)  # tied head, without a shared Parameter
