"""``GPT(fused_attention=True)`` (torch's ``scaled_dot_product_attention``, for a model that is
not vmapped) computes the same function as the default explicit-matmul attention."""

from __future__ import annotations

import torch

from powertrip.learning.gpt import GPT, gpt_shape


def test_fused_and_explicit_attention_give_the_same_logits_and_gradients():
    shape = gpt_shape("tiny", n_layer=2, context_length=16)
    torch.manual_seed(0)
    explicit = GPT(256, shape)
    fused = GPT(256, shape, fused_attention=True)
    fused.load_state_dict(explicit.state_dict())  # same names: checkpoints move between them
    idx = torch.randint(0, 256, (3, 16))

    a, b = explicit(idx), fused(idx)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    a.logsumexp(-1).sum().backward()
    b.logsumexp(-1).sum().backward()
    for (name, p), q in zip(explicit.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_the_default_stays_the_explicit_path_the_batched_trainer_vmaps():
    model = GPT(256, gpt_shape("tiny", n_layer=1))
    assert not any(getattr(m, "fused", False) for m in model.modules())
