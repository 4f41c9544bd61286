"""A byte-level BPE tokenizer for the ``lm`` workload, trained offline with HF ``tokenizers``.

Why this shape: a subword vocabulary shortens the token stream (more text per context window),
but every site of a federation must tokenize exactly alike or their updates train different
models. So the tokenizer is (1) trained deterministically on the TRAINING split only (the
validation text never leaks into the vocabulary), (2) saved as one JSON file whose sha256
names it, and (3) loaded only when that hash matches, so a worker holding a different
tokenizer refuses to start instead of silently training on other ids. Byte-level BPE starts
from the 256 byte symbols, so any UTF-8 text encodes and decodes back exactly, and every token
spells a known number of bytes, which keeps bits per byte comparable with byte tokens.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from powertrip.config.tokenizer import BPE_MAX_VOCAB, BPE_MIN_VOCAB, bpe_vocab_size
from powertrip.learning.datasets.progress import Meter
from powertrip.learning.datasets.record import DatasetError, default_cache_dir

__all__ = [
    "BPE_MAX_VOCAB",
    "BPE_MIN_VOCAB",
    "TokenizerMismatch",
    "bpe_vocab_size",
    "cached_bpe",
    "encode",
    "load_tokenizer",
    "save_tokenizer",
    "token_byte_lengths",
    "tokenizer_sha256",
    "train_bpe",
]


class TokenizerMismatch(DatasetError):
    """A saved tokenizer's hash differs from the one the run expects."""


def train_bpe(text: str, vocab_size: int) -> Tokenizer:
    """A byte-level BPE with at most ``vocab_size`` ids trained on ``text``. Every setting is
    pinned (no special tokens, min frequency 2, the full byte alphabet) so two trainings on the
    same text give the same JSON, and so the same hash.

    The trainer's own bar is off (it draws on the terminal whoever listens); progress goes to
    the installed ``on_progress`` in two steps: the characters counted into words as the
    trainer reads them, then the merges, which the trainer reports nothing of (0 of 1, then 1).
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    counting = Meter(len(text), f"BPE tokenizer ({vocab_size} ids): reading text (characters)")
    merging = Meter(1, f"BPE tokenizer ({vocab_size} ids): learning merges")

    def lines() -> Iterator[str]:
        done = 0
        counting(0)
        for line in text.splitlines(keepends=True):
            yield line
            done += len(line)
            counting(done)
        merging(0)

    tok.train_from_iterator(lines(), trainer=trainer, length=None)
    merging(1)
    return tok


def tokenizer_sha256(tok: Tokenizer) -> str:
    """The identity of a tokenizer: sha256 of its saved JSON (what ``save_tokenizer`` writes)."""
    return hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()


def save_tokenizer(tok: Tokenizer, path: Path) -> str:
    """Write ``tok`` as JSON to ``path`` (atomically: a crashed write leaves no half file that
    a later run would refuse) and return its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(tok.to_str(), encoding="utf-8")
    tmp.replace(path)
    return tokenizer_sha256(tok)


def load_tokenizer(path: Path, expected_sha256: str | None = None) -> Tokenizer:
    """The tokenizer saved at ``path``; with ``expected_sha256`` it must be that exact file,
    else ``TokenizerMismatch`` (one line naming the file and both hashes)."""
    return _load(path, expected_sha256)[0]


def _load(path: Path, expected_sha256: str | None) -> tuple[Tokenizer, str]:
    """The tokenizer at ``path`` and the sha256 of its file, read once."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read tokenizer ({exc})") from exc
    actual = hashlib.sha256(raw).hexdigest()
    _check(path, actual, expected_sha256)
    return Tokenizer.from_str(raw.decode("utf-8")), actual


def _check(path: Path, actual: str, expected: str | None) -> None:
    if expected is not None and actual != expected:
        raise TokenizerMismatch(
            f"{path}: tokenizer sha256 {actual} differs from the run's {expected}"
        )


def cached_bpe(
    train_text: str,
    vocab_size: int,
    cache_dir: Path | None = None,
    expected_sha256: str | None = None,
) -> tuple[Tokenizer, Path, str]:
    """(tokenizer, its file, its sha256) for ``train_text``: loaded from the cache when a
    previous run trained it (keyed by the text's sha256 and the vocabulary size), otherwise
    trained and saved there. The returned hash is what other workers must match; with
    ``expected_sha256`` a tokenizer with another hash is refused (``TokenizerMismatch``)."""
    corpus = hashlib.sha256(train_text.encode("utf-8")).hexdigest()
    root = default_cache_dir() if cache_dir is None else Path(cache_dir)
    path = root / "bpe" / f"{corpus[:32]}-{vocab_size}.json"
    if path.is_file():
        tok, sha = _load(path, expected_sha256)
        return tok, path, sha
    tok = train_bpe(train_text, vocab_size)
    sha = save_tokenizer(tok, path)
    _check(path, sha, expected_sha256)
    return tok, path, sha


def encode(tok: Tokenizer, text: str) -> np.ndarray:
    """``text`` as int64 token ids, encoded whole (split into lines, a whitespace run that
    spans a newline would pre-tokenize differently)."""
    return np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)


def token_byte_lengths(tok: Tokenizer) -> np.ndarray:
    """UTF-8 bytes each id spells (byte-level: one alphabet symbol per byte), to turn a count
    of predicted tokens into the byte count bits per byte divides by."""
    vocab = tok.get_vocab()
    lengths = np.zeros(max(vocab.values()) + 1, dtype=np.int64)
    for token, i in vocab.items():
        lengths[i] = len(token)
    return lengths
