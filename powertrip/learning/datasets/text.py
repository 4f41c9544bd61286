"""Language-model data: a token stream cut into fixed-length windows, x = tokens[t:t+T] and
y = tokens[t+1:t+T+1], so every position of a window predicts the token after it.

Text is tokenized as UTF-8 bytes (vocabulary 256). At the CPU sizes this project trains, a
byte vocabulary keeps the embedding and the tied head small (33 k parameters at d_model 128,
against ~0.5 M for a 4 k BPE), needs no trained vocabulary that every worker would have to
rebuild identically, and round-trips any text exactly. A corpus tokenized elsewhere (any BPE)
comes in as a ``.npy`` of token ids; ``tokenizer="bpe-N"`` instead trains a byte-level BPE of
N ids on the training text (bpe.py: deterministic, cached, identified by its sha256). Then the
Dataset's ``val_bytes`` counts the bytes its validation targets spell, so bits per byte stays
comparable with byte tokens.

Without a file, the loader generates an English-like corpus from a small seeded grammar, so a
study runs on a fresh, offline machine; that data is marked synthetic wherever it is reported.
The validation set is the last ``val_fraction`` of the stream: a deterministic split with no
window straddling it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from powertrip.config.tokenizer import bpe_vocab_size
from powertrip.learning.datasets.bpe import cached_bpe, encode, token_byte_lengths
from powertrip.learning.datasets.progress import Meter
from powertrip.learning.datasets.record import Dataset, DatasetError, check_fraction
from powertrip.learning.device import tensor

__all__ = [
    "BYTE_VOCAB",
    "decode_bytes",
    "encode_bytes",
    "load_text",
    "read_corpus",
    "synthetic_corpus",
]

BYTE_VOCAB = 256


def encode_bytes(text: str) -> np.ndarray:
    """Text to token ids: its UTF-8 bytes, as int64."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def decode_bytes(tokens: np.ndarray | list[int]) -> str:
    """Token ids back to text (the inverse of ``encode_bytes``)."""
    return bytes(np.asarray(tokens, dtype=np.uint8).tobytes()).decode("utf-8", errors="replace")


def _syllable_words(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[str]:
    syllables = [c + v for c in "bcdfghklmnprstvw" for v in "aeiou"]
    return ["".join(rng.choice(syllables, size=rng.integers(lo, hi + 1))) for _ in range(n)]


def synthetic_corpus(num_bytes: int, seed: int = 0) -> str:
    """At least ``num_bytes`` of generated, English-like text (speaker lines of templated
    sentences over a Zipf-weighted invented vocabulary): learnable structure at every scale,
    from spelling to grammar, with no data file."""
    rng = np.random.default_rng([seed, 0x7E27])
    nouns, verbs, adjs = (_syllable_words(rng, n, 1, 3) for n in (120, 40, 40))
    names = [w.capitalize() for w in _syllable_words(rng, 12, 2, 3)]

    def pick(words: list[str]) -> str:
        p = 1.0 / np.arange(1, len(words) + 1)
        return words[rng.choice(len(words), p=p / p.sum())]

    def sentence() -> str:
        kind = rng.integers(4)
        if kind == 0:
            return f"the {pick(adjs)} {pick(nouns)} {pick(verbs)}s the {pick(nouns)}."
        if kind == 1:
            noun, adj = pick(nouns), pick(adjs)
            return f"{pick(names)} {pick(verbs)}s a {pick(nouns)}, and the {noun} is {adj}."
        if kind == 2:
            return f"shall we {pick(verbs)} the {pick(adjs)} {pick(nouns)}?"
        return f"no {pick(nouns)} {pick(verbs)}s so {pick(adjs)} as {pick(names)}!"

    parts: list[str] = []
    size = 0
    meter = Meter(num_bytes, "synthetic corpus (bytes)")
    meter(0)
    while size < num_bytes:
        speech = " ".join(sentence() for _ in range(rng.integers(1, 4)))
        line = f"{pick(names).upper()}:\n{speech[0].upper()}{speech[1:]}\n\n"
        parts.append(line)
        size += len(line)
        meter(size)
    return "".join(parts)


def read_corpus(path: Path) -> tuple[np.ndarray, int]:
    """(token ids, vocabulary size) of a text file (bytes) or a ``.npy`` of token ids."""
    if not path.is_file():
        raise DatasetError(f"{path}: text file or .npy token corpus not found")
    if path.suffix == ".npy":
        try:
            ids = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{path}: not a readable .npy array ({exc})") from exc
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer) or ids.size == 0:
            raise DatasetError(f"{path}: expected a non-empty 1-D integer array of token ids")
        if ids.min() < 0:
            raise DatasetError(f"{path}: token ids must be >= 0, found {int(ids.min())}")
        return ids.astype(np.int64), int(ids.max()) + 1
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read ({exc})") from exc
    if not raw.strip():
        raise DatasetError(f"{path}: file is empty")
    bad = raw.find(b"\x00")  # NUL is valid UTF-8 but never in text
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = exc.start if bad < 0 else min(bad, exc.start)
    if bad >= 0:
        raise DatasetError(
            f"{path}: binary, not UTF-8 text (byte {bad}); give a text file or a .npy of token ids"
        )
    return np.frombuffer(raw, dtype=np.uint8).astype(np.int64), BYTE_VOCAB


def _windows(stream: np.ndarray, length: int, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping windows (every token is a target once per pass), the first ``limit``."""
    starts = np.arange(0, len(stream) - length, length)[:limit]
    idx = starts[:, None] + np.arange(length)
    return stream[idx], stream[idx + 1]


def load_text(
    path: Path | None,
    context_length: int = 64,
    max_samples: int | None = None,
    val_fraction: float = 0.1,
    seed: int = 0,
    tokenizer: str = "bytes",
    tokenizer_sha256: str | None = None,
) -> Dataset:
    """Windows of ``context_length`` tokens from ``path`` (None: the synthetic corpus).

    ``max_samples`` caps the training windows (the first ones of the stream) and the
    validation windows in proportion; ``seed`` only seeds the synthetic corpus. ``tokenizer``:
    ``"bytes"`` (UTF-8 bytes) or ``"bpe-N"`` (byte-level BPE trained on the training split);
    ``tokenizer_sha256``: the BPE must be exactly that one (``bpe.TokenizerMismatch`` if not).
    """
    check_fraction(val_fraction)
    bpe_vocab = bpe_vocab_size(tokenizer)
    if context_length < 1:
        raise ValueError(f"context_length must be >= 1, got {context_length}")
    if path is None:
        train_windows = max_samples or 20_000
        num_bytes = int((train_windows + 2) * context_length / (1 - val_fraction)) + 1
        tokens, vocab = encode_bytes(synthetic_corpus(num_bytes, seed)), BYTE_VOCAB
    else:
        tokens, vocab = read_corpus(Path(path))
    if bpe_vocab is not None and vocab != BYTE_VOCAB:
        raise DatasetError(f"{path}: a .npy of token ids is already tokenized; use 'bytes'")
    n_val = round(len(tokens) * val_fraction)
    train, val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]
    byte_lengths, sha = None, None
    if bpe_vocab is not None:  # the same byte split, re-cut at a character boundary
        train, val, byte_lengths, sha = _bpe_split(train, val, bpe_vocab, tokenizer_sha256)
        vocab, n_val = bpe_vocab, len(val)
    val_limit = None if max_samples is None else max(1, round(max_samples * n_val / len(train)))
    x_tr, y_tr = _windows(train, context_length, max_samples)
    x_te, y_te = _windows(val, context_length, val_limit)
    if len(x_tr) == 0 or len(x_te) == 0:
        where = "synthetic corpus" if path is None else str(path)
        raise DatasetError(
            f"{where}: {len(tokens)} tokens give no {context_length + 1}-token window on both "
            f"sides of a {val_fraction:.0%} validation split; use a longer text or a shorter "
            "context"
        )
    return Dataset(
        name="lm",
        task="lm",
        x_train=tensor(np.ascontiguousarray(x_tr)),
        y_train=tensor(np.ascontiguousarray(y_tr)),
        x_test=tensor(np.ascontiguousarray(x_te)),
        y_test=tensor(np.ascontiguousarray(y_te)),
        num_classes=vocab,
        groups_train=None,
        synthetic=path is None,
        val_bytes=None if byte_lengths is None else int(byte_lengths[y_te].sum()),
        tokenizer_sha256=sha,
    )


def _bpe_split(
    train: np.ndarray, val: np.ndarray, vocab_size: int, expected_sha256: str | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """The byte split's two sides as BPE ids (the tokenizer sees only the training text), the
    bytes each id spells and the tokenizer's sha256. The boundary moves back to the start of a
    character, so both sides are valid UTF-8."""
    cut = len(train)
    raw = np.concatenate([train, val]).astype(np.uint8).tobytes()
    while 0 < cut < len(raw) and (raw[cut] & 0xC0) == 0x80:  # a continuation byte
        cut -= 1
    train_text, val_text = raw[:cut].decode("utf-8"), raw[cut:].decode("utf-8")
    tok, _, sha = cached_bpe(train_text, vocab_size, expected_sha256=expected_sha256)
    return encode(tok, train_text), encode(tok, val_text), token_byte_lengths(tok), sha
