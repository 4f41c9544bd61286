"""The byte-level BPE tokenizer: trained deterministically on the training split only,
identified by the sha256 of its saved JSON, refused on a hash mismatch, and off by default (the
byte path, and so every earlier result, is unchanged)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from powertrip.config.curtailment import CurtailmentConfig
from powertrip.config.experiment import ExperimentConfig
from powertrip.config.tokenizer import bpe_vocab_size
from powertrip.learning.datasets.bpe import (
    TokenizerMismatch,
    cached_bpe,
    encode,
    load_tokenizer,
    save_tokenizer,
    token_byte_lengths,
    tokenizer_sha256,
    train_bpe,
)
from powertrip.learning.datasets.text import BYTE_VOCAB, load_text, synthetic_corpus

TEXT = synthetic_corpus(60_000, seed=3)
TRAIN, VAL = TEXT[:54_000], TEXT[54_000:]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POWERTRIP_CACHE_DIR", str(tmp_path / "cache"))


def test_two_trainings_on_the_same_text_give_the_same_tokenizer_hash():
    assert tokenizer_sha256(train_bpe(TRAIN, 400)) == tokenizer_sha256(train_bpe(TRAIN, 400))
    assert tokenizer_sha256(train_bpe(TRAIN, 400)) != tokenizer_sha256(train_bpe(TRAIN, 300))


def test_the_validation_text_round_trips_exactly_and_byte_counts_add_up():
    tok = train_bpe(TRAIN, 400)
    text = VAL + "Roméo — 東京\n\n  \t end"

    ids = encode(tok, text)

    assert tok.decode(ids.tolist()) == text
    assert token_byte_lengths(tok)[ids].sum() == len(text.encode("utf-8"))
    assert len(ids) < len(text.encode("utf-8"))


def test_the_saved_file_is_checked_by_hash_and_a_mismatch_names_the_file(tmp_path):
    path = tmp_path / "tok.json"
    sha = save_tokenizer(train_bpe(TRAIN, 300), path)

    assert tokenizer_sha256(load_tokenizer(path, sha)) == sha
    with pytest.raises(TokenizerMismatch, match=rf"{path}.*{sha[:8]}.*0+") as err:
        load_tokenizer(path, "0" * 64)
    assert "\n" not in str(err.value)


def test_the_trained_tokenizer_is_cached_by_corpus_and_vocabulary(tmp_path):
    _, path, sha = cached_bpe(TRAIN, 300)
    _, again, sha_again = cached_bpe(TRAIN, 300)

    assert path == again and sha == sha_again and path.is_relative_to(tmp_path / "cache")


def test_bpe_windows_have_the_requested_vocabulary_fewer_tokens_and_their_byte_count(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")

    data = load_text(path, context_length=16, tokenizer="bpe-512")
    raw = load_text(path, context_length=16)

    assert data.num_classes == 512 and int(data.x_train.max()) < 512
    assert data.x_train.numel() < raw.x_train.numel() / 2
    assert (data.x_train[:, 1:] == data.y_train[:, :-1]).all()
    assert data.val_bytes is not None and data.val_bytes > data.y_test.numel()
    assert raw.val_bytes is None


def test_the_byte_path_is_unchanged_by_default():
    base = load_text(None, context_length=16, max_samples=200, seed=1)
    same = load_text(None, context_length=16, max_samples=200, seed=1, tokenizer="bytes")

    assert base.num_classes == BYTE_VOCAB
    for a, b in ((base.x_train, same.x_train), (base.y_test, same.y_test)):
        assert torch.equal(a, b)
    stream = np.frombuffer(synthetic_corpus(4000, seed=1).encode(), dtype=np.uint8)
    assert np.array_equal(base.x_train[0].numpy(), stream[:16])


@pytest.mark.parametrize("bad", ["bpe-259", "bpe-70000", "bpe", "sentencepiece", "bpe-512x"])
def test_unknown_tokenizers_are_refused(bad):
    with pytest.raises(ValueError, match="tokenizer"):
        bpe_vocab_size(bad)
    with pytest.raises(ValueError, match="tokenizer"):
        ExperimentConfig(workload="lm", partition="iid", tokenizer=bad)


def test_the_config_dump_is_unchanged_by_default_and_carries_a_chosen_tokenizer():
    for cls in (ExperimentConfig, CurtailmentConfig):
        assert "tokenizer" not in cls(workload="lm").model_dump()
        assert cls(workload="lm", tokenizer="bpe-2048").model_dump()["tokenizer"] == "bpe-2048"
    with pytest.raises(ValueError, match="lm workload"):
        ExperimentConfig(workload="mnist1d", tokenizer="bpe-512")


def test_the_lm_workload_takes_its_vocabulary_from_the_configured_tokenizer():
    from powertrip.federation import load_workload

    cfg = ExperimentConfig(workload="lm", num_samples=200, context_length=16, tokenizer="bpe-300")

    assert load_workload(cfg).num_classes == 300


def test_both_study_commands_take_a_tokenizer_flag_and_refuse_a_bad_one():
    from click.testing import CliRunner

    from powertrip.services.cli.main import main

    runner = CliRunner()
    bad = runner.invoke(main, ["experiment", "--workload", "lm", "--tokenizer", "bpe-1"])

    assert bad.exit_code != 0 and "--tokenizer" in bad.output and "bpe-1" in bad.output
    assert "--tokenizer" in runner.invoke(main, ["curtail", "--help"]).output


def test_a_worker_with_another_tokenizer_refuses_the_aggregators_config(tmp_path, monkeypatch):
    """The aggregator stamps its BPE's hash into the config it hands out; a worker whose
    cached tokenizer differs (here: the cached file was altered) refuses to build its sites."""
    from powertrip.config.tokenizer import with_tokenizer_hash
    from powertrip.federation import load_workload
    from powertrip.services.worker.sites_host import SitesHost

    cfg = ExperimentConfig(
        workload="lm", num_samples=200, context_length=16, tokenizer="bpe-300", num_sites=4
    )
    data = load_workload(cfg)
    handed_out = with_tokenizer_hash(cfg, data.tokenizer_sha256).model_dump_json()
    worker_cfg = ExperimentConfig.model_validate_json(handed_out)

    assert worker_cfg.tokenizer_sha256 == data.tokenizer_sha256
    assert load_workload(worker_cfg).num_classes == 300  # same tokenizer: joins
    (cached,) = (tmp_path / "cache" / "bpe").glob("*.json")
    cached.write_text(cached.read_text().replace('"vocab"', '"vocab" '))
    with pytest.raises(TokenizerMismatch, match=rf"{cached}.*differs from the run's"):
        SitesHost(worker_cfg, run_seed=0, sites=[0, 1])
    assert "tokenizer_sha256" not in cfg.model_dump()
