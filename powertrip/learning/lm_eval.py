"""Held-out language-model quality in the units practitioners compare: mean loss per token over
a WHOLE validation stream (not a few random batches, whose mean is noisy and optimistic) and
bits per byte, which, unlike loss per token, compares models with different tokenizers.

The stream is cut into consecutive windows of the model's context (the last one may be shorter),
so every token after the first is predicted exactly once, from the tokens before it in its
window. Bits per byte divides the summed loss by the UTF-8 byte count of the predicted text:
for byte tokens that is the number of predicted tokens, for a subword tokenizer it is larger.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from powertrip.learning.datasets.record import Dataset
from powertrip.learning.datasets.text import BYTE_VOCAB

__all__ = ["LMEval", "bits_per_byte", "evaluate_lm", "validation_bytes"]


@dataclass(frozen=True)
class LMEval:
    nats_per_token: float
    tokens: int  # predicted tokens
    bytes: int  # UTF-8 bytes of the predicted text

    @property
    def nats_per_byte(self) -> float:
        return self.nats_per_token * self.tokens / self.bytes

    @property
    def bits_per_byte(self) -> float:
        return bits_per_byte(self.nats_per_token, self.tokens, self.bytes)


def bits_per_byte(nats_per_token: float, tokens: int, num_bytes: int) -> float:
    """Mean loss per token (nats) over ``tokens`` predicted tokens spelling ``num_bytes``
    bytes, as bits per byte."""
    if tokens < 1 or num_bytes < 1:
        raise ValueError(f"need >= 1 token and byte, got {tokens} tokens, {num_bytes} bytes")
    return nats_per_token * tokens / num_bytes / math.log(2)


def validation_bytes(data: Dataset) -> tuple[int, int] | None:
    """(predicted tokens, UTF-8 bytes they spell) of an LM dataset's validation windows, with
    which the studies' mean loss per token over them becomes bits per byte: a BPE's
    ``val_bytes``, one byte per token for byte tokens. None for a ``.npy`` of ids from an
    unknown tokenizer (a vocabulary other than the bytes' and no ``val_bytes``)."""
    tokens = int(data.y_test.numel())
    if data.val_bytes is not None:
        return tokens, int(data.val_bytes)
    return (tokens, tokens) if data.num_classes == BYTE_VOCAB else None


@torch.no_grad()
def evaluate_lm(
    model: Callable[[torch.Tensor], torch.Tensor],
    tokens: torch.Tensor,
    context_length: int,
    num_bytes: int | None = None,
    batch_size: int = 64,
) -> LMEval:
    """Loss of ``model`` (token ids [B, T] -> logits [B, T, V]) on every token of the 1-D
    stream ``tokens`` but the first. ``num_bytes``: UTF-8 bytes of the predicted text
    (``tokens[1:]``); None means byte tokens (one byte each)."""
    if tokens.ndim != 1 or len(tokens) < 2:
        raise ValueError("tokens must be a 1-D stream of at least 2 token ids")
    if context_length < 1:
        raise ValueError(f"context_length must be >= 1, got {context_length}")
    predicted = len(tokens) - 1
    full = predicted // context_length
    total = 0.0
    idx = torch.arange(context_length)
    for lo in range(0, full, batch_size):
        starts = torch.arange(lo, min(lo + batch_size, full)) * context_length
        x, y = tokens[starts[:, None] + idx], tokens[starts[:, None] + idx + 1]
        total += _summed_loss(model, x, y)
    if rest := predicted - full * context_length:
        start = full * context_length
        x, y = tokens[start : start + rest][None], tokens[start + 1 : start + rest + 1][None]
        total += _summed_loss(model, x, y)
    return LMEval(total / predicted, predicted, predicted if num_bytes is None else num_bytes)


def _summed_loss(
    model: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> float:
    logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="sum").item()
