"""Held-out LM evaluation: every token of the validation stream but the first is predicted
exactly once, and bits per byte counts the bytes of the text, not the tokens."""

from __future__ import annotations

import math

import pytest
import torch

from powertrip.learning.lm_eval import bits_per_byte, evaluate_lm

VOCAB = 10


class _Uniform(torch.nn.Module):
    """Knows nothing: loss ln(VOCAB) on every token. Records the windows it was shown."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.extend(x.shape[1] for _ in range(x.shape[0]))
        return torch.zeros(*x.shape, VOCAB)


class _Counter(torch.nn.Module):
    """Bets logit ``margin`` on token x + 1 (mod VOCAB)."""

    def __init__(self, margin: float) -> None:
        super().__init__()
        self.margin = margin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot((x + 1) % VOCAB, VOCAB).float() * self.margin


def test_a_model_that_knows_nothing_costs_log2_of_the_vocabulary_bits_per_byte_token():
    model = _Uniform()
    result = evaluate_lm(model, torch.arange(23) % VOCAB, context_length=5, batch_size=2)

    assert result.tokens == 22 and result.bytes == 22
    assert sorted(model.seen) == [2, 5, 5, 5, 5]  # four whole windows and the short tail
    assert result.nats_per_token == pytest.approx(math.log(VOCAB))
    assert result.bits_per_byte == pytest.approx(math.log2(VOCAB))


def test_the_loss_is_the_mean_over_predicted_tokens_of_the_true_tokens_cross_entropy():
    stream = torch.tensor([0, 1, 2, 3, 7, 8, 9, 0])  # one jump (3 -> 7): one wrong bet of 7
    margin = 3.0
    result = evaluate_lm(_Counter(margin), stream, context_length=4)

    right = math.log(math.exp(margin) + VOCAB - 1) - margin
    wrong = math.log(math.exp(margin) + VOCAB - 1)
    assert result.nats_per_token == pytest.approx((6 * right + wrong) / 7)


def test_multi_byte_tokens_spread_the_loss_over_the_bytes_of_the_text():
    # 'é' is two UTF-8 bytes: a tokenizer that reads "héllo" as 5 tokens spells 6 bytes
    assert len("héllo".encode()) == 6
    assert bits_per_byte(2.0, tokens=5, num_bytes=6) == pytest.approx(2.0 * 5 / 6 / math.log(2))
    result = evaluate_lm(_Uniform(), torch.zeros(6, dtype=torch.long), 4, num_bytes=6)
    assert result.nats_per_byte == pytest.approx(math.log(VOCAB) * 5 / 6)


def test_a_stream_too_short_to_predict_anything_is_refused():
    with pytest.raises(ValueError, match="at least 2"):
        evaluate_lm(_Uniform(), torch.zeros(1, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="byte"):
        bits_per_byte(1.0, tokens=0, num_bytes=0)
