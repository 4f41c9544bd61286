"""The language-model data: text becomes byte tokens, the stream becomes windows whose targets
are the inputs shifted by one, and the validation split is the end of the stream."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.learning.datasets import DatasetError
from powertrip.learning.datasets.text import (
    BYTE_VOCAB,
    decode_bytes,
    encode_bytes,
    load_text,
    synthetic_corpus,
)


def test_text_round_trips_through_byte_tokens_including_non_ascii():
    text = "O Romeo, Romeo! wherefore art thou — Roméo?\n"

    tokens = encode_bytes(text)

    assert tokens.dtype == np.int64 and tokens.max() < BYTE_VOCAB
    assert decode_bytes(tokens) == text


def test_each_window_target_is_its_input_shifted_by_one_token(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(chr(ord("a") + i % 26) for i in range(2000)))

    data = load_text(path, context_length=16)

    assert data.x_train.shape[1] == data.y_train.shape[1] == 16
    assert data.task == "lm" and data.num_classes == BYTE_VOCAB and not data.synthetic
    for x, y in ((data.x_train, data.y_train), (data.x_test, data.y_test)):
        assert (x[:, 1:] == y[:, :-1]).all()
        assert ((x[:, 0] + 1 - ord("a")) % 26 == (y[:, 0] - ord("a")) % 26).all()


def test_validation_is_the_last_tenth_of_the_stream_and_the_split_is_deterministic(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(synthetic_corpus(20_000, seed=3))
    tokens = encode_bytes(path.read_text())

    a, b = load_text(path, context_length=32), load_text(path, context_length=32)

    assert (a.x_train == b.x_train).all() and (a.x_test == b.x_test).all()
    val_start = len(tokens) - round(len(tokens) * 0.1)
    assert (a.x_test[0].numpy() == tokens[val_start : val_start + 32]).all()
    last = (len(a.x_train) - 1) * 32  # no training window reaches into the validation part
    assert (a.y_train[-1].numpy() == tokens[last + 1 : last + 33]).all()
    assert last + 33 <= val_start


def test_a_pre_tokenized_npy_corpus_keeps_its_ids_and_vocabulary(tmp_path):
    ids = np.random.default_rng(0).integers(0, 5000, size=4000)
    np.save(tmp_path / "tokens.npy", ids)

    data = load_text(tmp_path / "tokens.npy", context_length=20)

    assert data.num_classes == int(ids.max()) + 1
    assert (data.x_train[0].numpy() == ids[:20]).all()
    assert (data.y_train[0].numpy() == ids[1:21]).all()


def test_without_a_file_the_corpus_is_generated_from_its_seed_and_marked_synthetic():
    a = load_text(None, context_length=32, max_samples=100, seed=0)
    b = load_text(None, context_length=32, max_samples=100, seed=0)

    assert a.synthetic and len(a.x_train) == 100
    assert (a.x_train == b.x_train).all()
    assert not (a.x_train == load_text(None, 32, max_samples=100, seed=1).x_train).all()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "file is empty"),
        (b"  \n\n", "file is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary, not UTF-8 text"),
        (b"abc\xff\xfe", "binary, not UTF-8 text"),
        (b"too short", "no 65-token window"),
    ],
)
def test_unusable_files_are_refused_with_a_message_naming_them(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)

    with pytest.raises(DatasetError, match=message) as err:
        load_text(path, context_length=64)
    assert "bad.txt" in str(err.value)


def test_a_npy_that_is_not_a_token_stream_is_refused(tmp_path):
    np.save(tmp_path / "floats.npy", np.zeros((3, 4), dtype=np.float32))

    with pytest.raises(DatasetError, match="1-D integer array"):
        load_text(tmp_path / "floats.npy")
