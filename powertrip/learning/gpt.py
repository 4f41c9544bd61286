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

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from powertrip.learning.shapes import named_shape
from powertrip.learning.transformer import Block, check_size

__all__ = ["GPT", "GPT_SIZES", "GPTShape", "gpt_shape"]


@dataclass(frozen=True)
class GPTShape:
    n_layer: int
    n_head: int
    d_model: int
    context_length: int

    def __post_init__(self) -> None:
        check_size(self, "GPT", width="d_model", heads="n_head")


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
            Block(shape.d_model, shape.n_head, 4 * shape.d_model, shape.n_layer, fused_attention)
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
