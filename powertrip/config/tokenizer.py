"""The ``tokenizer`` setting of the LM workload, a mixin both study configs inherit (like
``LocalOptimizerSettings``): ``"bytes"`` (UTF-8 bytes, vocabulary 256, the default) or
``"bpe-N"`` (a byte-level BPE of N ids, datasets/bpe.py). Kept apart from the trainer so that
validating a config never imports ``tokenizers``; left out of dumps while the default, so the
summaries of existing runs do not change.
"""

from __future__ import annotations

import re
from typing import Annotated, Self, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator

from powertrip.config.fields import omitted_at_default

__all__ = [
    "BPE_MAX_VOCAB",
    "BPE_MIN_VOCAB",
    "TokenizerSettings",
    "bpe_vocab_size",
    "with_tokenizer_hash",
]

#: byte-level BPE needs the 256 byte symbols plus a few merges to be worth the name; 65536
#: keeps ids in a uint16 and the tied embedding within reach of the sizes this project trains
BPE_MIN_VOCAB, BPE_MAX_VOCAB = 260, 65536
_NAME = re.compile(r"bpe-(\d+)")


def bpe_vocab_size(name: str) -> int | None:
    """The vocabulary size ``N`` of ``"bpe-N"``, None for ``"bytes"``; anything else refused."""
    if name == "bytes":
        return None
    m = _NAME.fullmatch(name)
    if m is None or not BPE_MIN_VOCAB <= int(m.group(1)) <= BPE_MAX_VOCAB:
        raise ValueError(
            f"tokenizer must be 'bytes' or 'bpe-N' with {BPE_MIN_VOCAB} <= N <= {BPE_MAX_VOCAB}, "
            f"got {name!r}"
        )
    return int(m.group(1))


def _valid(name: str) -> str:
    bpe_vocab_size(name)
    return name


class TokenizerSettings(BaseModel):
    """How the ``lm`` workload tokenizes its text; the LM's vocabulary follows from it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer: Annotated[str, AfterValidator(_valid)] = omitted_at_default(
        "bytes",
        "LM: 'bytes' (default, vocabulary 256) or 'bpe-N', a byte-level BPE of N ids "
        "(260..65536) trained on the training text, cached and checked by sha256.",
    )
    #: the sha256 of the BPE's saved JSON that every process must rebuild; the aggregator fills
    #: it in from its own before handing the config to the workers (None: not checked)
    tokenizer_sha256: str | None = omitted_at_default(None, pattern=r"^[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _lm_only(self) -> Self:
        workload = getattr(self, "workload", "lm")
        if self.tokenizer != "bytes" and workload != "lm":
            raise ValueError(f"--tokenizer {self.tokenizer} is for the lm workload, not {workload}")
        if self.tokenizer_sha256 is not None and self.tokenizer == "bytes":
            raise ValueError("tokenizer_sha256 names a BPE; byte tokens have nothing to check")
        return self


_C = TypeVar("_C", bound=TokenizerSettings)


def with_tokenizer_hash(cfg: _C, sha256: str | None) -> _C:
    """``cfg`` carrying the hash of the tokenizer its dataset was built with, for the workers
    to match (unchanged for byte tokens, or when it already names that hash)."""
    if sha256 is None or cfg.tokenizer_sha256 == sha256:
        return cfg
    return cfg.model_copy(update={"tokenizer_sha256": sha256})
