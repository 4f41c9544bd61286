"""A GPT-style language model on the run's text file or .npy of token ids (without one, an
embedded generated corpus): windows of the model's context, at most ``num_samples`` for
training, tokenised by the run's tokenizer (the vocabulary follows from it)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import nn

from powertrip.learning.custom import RunSettings
from powertrip.learning.datasets import Dataset, load_text
from powertrip.learning.gpt import GPT, GPTShape, gpt_shape
from powertrip.learning.workloads import builtin

__all__ = ["LM", "lm_shape"]


def lm_shape(run: RunSettings) -> GPTShape:
    """The language model's shape: the named size (tiny by default) and the run's overrides."""
    return gpt_shape(
        run.model_size,
        n_layer=run.n_layer,
        n_head=run.n_head,
        d_model=run.d_model,
        context_length=run.context_length,
    )


def _data(run: RunSettings, seed: int) -> Dataset:
    return load_text(
        run.dataset_path,
        context_length=lm_shape(run).context_length,
        max_samples=run.num_samples,
        seed=seed,
        tokenizer=run.tokenizer,
        tokenizer_sha256=run.tokenizer_sha256,  # a worker must rebuild the aggregator's
    )


def _model(run: RunSettings, data: Dataset) -> nn.Module:
    return GPT(data.num_classes, lm_shape(run))


def _rank_model(run: RunSettings, data: Dataset) -> Callable[[], nn.Module]:
    """The same model with ``scaled_dot_product_attention``: nothing is vmapped in a rank
    process; same parameters, same logits."""
    return partial(GPT, data.num_classes, lm_shape(run), fused_attention=True)


LM = builtin("lm", "next token of a text, a GPT", _data, run_model=_model, rank_model=_rank_model)
