"""Built-in workloads are ``CustomWorkload``s, registered by name in the settings' torch-free
table (``config.workloads.BUILTINS``) and imported on first use, as a user's reference is: the
composition root asks the workload for its data, model and rank model, and names none."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import powertrip.config.workloads as workloads
from powertrip.config.experiment import build_config
from powertrip.config.workload_defaults import WORKLOAD_DEFAULTS, WorkloadDefaults
from powertrip.config.workloads import (
    BUILTIN_WORKLOADS,
    BUILTINS,
    BuiltinEntry,
    needs_dataset_path,
    register_workload,
    workload_declaration,
)
from powertrip.federation import build_federation, load_workload, site_model_factory
from powertrip.learning.custom import CustomWorkload, dataset_from_arrays, declared_workload
from powertrip.learning.gpt import GPT
from powertrip.learning.kwt import KWT
from powertrip.learning.models import CNN1D, CNN2D, CharLSTM
from powertrip.learning.trainer import get_params
from tests.workloads import blobs, plain_mlp

FEDERATION = Path(__file__).resolve().parents[2] / "powertrip" / "federation.py"


def test_every_built_in_is_a_custom_workload_declared_under_its_name_at_its_defaults():
    assert set(BUILTINS) == set(WORKLOAD_DEFAULTS) == set(BUILTIN_WORKLOADS)
    for name in BUILTIN_WORKLOADS:
        workload = declared_workload(name)
        assert isinstance(workload, CustomWorkload) and workload.name == name
        defaults = WORKLOAD_DEFAULTS[name]
        assert (workload.lr, workload.batch_size) == (defaults.lr, defaults.batch_size)
        assert workload.partitioner is workload.loss is workload.train_step is None


def _images(shape: tuple[int, ...], classes: int) -> object:
    return dataset_from_arrays(np.zeros((5, *shape)), np.arange(5) % classes, num_classes=classes)


@pytest.mark.parametrize(
    ("name", "in_shape", "model"),
    [
        ("mnist1d", (1, 40), CNN1D),
        ("mnist", (1, 28, 28), CNN2D),
        ("emnist", (1, 28, 28), CNN2D),
        ("speech-commands", (101, 40), KWT),
        ("fsdd", (101, 40), KWT),
    ],
)
def test_each_built_in_trains_the_papers_model_for_its_data(name, in_shape, model):
    data = _images(in_shape, classes=3)
    built = declared_workload(name).build_model(data)
    assert isinstance(built, model) and built(data.x_train).shape == (4, 3)


def test_shakespeare_trains_the_lstm_over_its_characters():
    chars = dataset_from_arrays(np.zeros((5, 80), np.int64), np.arange(5), num_classes=80)
    assert isinstance(declared_workload("shakespeare").build_model(chars), CharLSTM)


def test_the_lm_is_sized_by_the_run_and_its_rank_processes_get_fused_attention():
    cfg = build_config(None, workload="lm", num_samples=100, model_size="tiny", context_length=16)
    data = load_workload(cfg)
    torch.manual_seed(0)
    model = declared_workload("lm").initial_model(cfg, data)
    assert isinstance(model, GPT) and model.shape.context_length == 16
    rank = site_model_factory(cfg, data, model)()
    assert isinstance(rank, GPT) and any(getattr(m, "fused", False) for m in rank.modules())
    assert rank.shape == model.shape and rank.state_dict().keys() == model.state_dict().keys()


def test_a_users_workload_with_a_built_ins_declaration_is_the_same_federation():
    """The built-in ``mnist1d`` and a user's copy of its declaration, registered by another
    name, give the same data, partitions, initial model, lr and one round's updates."""
    builtin = declared_workload("mnist1d")
    mine = CustomWorkload(
        name="my-mnist1d", run_data=builtin.run_data, model=builtin.model, lr=builtin.lr
    )
    feds = []
    for name in ("mnist1d", register_workload(mine)):
        cfg = build_config(None, workload=name, num_samples=400, num_sites=4, partition="iid")
        feds.append(build_federation(cfg, load_workload(cfg, seed=1), seed=1, device="cpu"))
    ours, theirs = feds
    assert ours.trainer.config == theirs.trainer.config
    assert all(
        np.array_equal(a, b) for a, b in zip(ours.partitions, theirs.partitions, strict=True)
    )
    for fed in feds:
        assert torch.equal(fed.x_train, ours.x_train) and torch.equal(fed.y_test, ours.y_test)
    start = get_params(ours.trainer.model)
    torch.testing.assert_close(start, get_params(theirs.trainer.model), rtol=0, atol=0)
    rounds = [
        f.trainer.train(start, f.x_train, f.y_train, f.partitions, seeds=[0, 1, 2, 3]) for f in feds
    ]
    torch.testing.assert_close(rounds[0].deltas, rounds[1].deltas, rtol=0, atol=0)


def test_a_new_built_in_is_a_declaration_a_table_line_and_its_defaults(monkeypatch):
    monkeypatch.setattr(workloads, "_declared", {})
    monkeypatch.setitem(BUILTINS, "blobs", BuiltinEntry("tests.workloads:blobs_builtin", True))
    monkeypatch.setitem(WORKLOAD_DEFAULTS, "blobs", WorkloadDefaults(lr=0.3, batch_size=8))  # type: ignore[index]
    cfg = build_config(None, workload="blobs", num_sites=3, partition="iid")
    assert (cfg.learning_rate, cfg.local_batch_size) == (0.3, 8)
    fed = build_federation(cfg, load_workload(cfg), seed=0, device="cpu")
    assert fed.trainer.config.lr == 0.3 and len(fed.partitions) == 3
    assert torch.equal(fed.y_train.sort().values, blobs().y_train.sort().values)
    assert fed.trainer.model(fed.x_test[:2]).shape == (2, 4)
    with pytest.raises(ValueError, match="'blobs' is a built-in workload's name"):
        register_workload(CustomWorkload(name="blobs", model=plain_mlp, data=blobs()))


def test_a_table_line_naming_another_workloads_declaration_is_refused(monkeypatch):
    monkeypatch.setattr(workloads, "_declared", {})
    monkeypatch.setitem(BUILTINS, "wrong", BuiltinEntry("tests.workloads:plain_blobs"))
    with pytest.raises(ValueError, match="'wrong': tests.workloads:plain_blobs declares 'plain-b"):
        workload_declaration("wrong")


def test_only_built_ins_of_real_data_need_a_dataset_path():
    assert [w for w in BUILTIN_WORKLOADS if not needs_dataset_path(w)] == ["mnist1d", "lm"]
    assert not needs_dataset_path("tests.workloads:plain_blobs") and not needs_dataset_path(None)
    with pytest.raises(ValueError, match="'shakespeare' needs --dataset-path"):
        build_config(None, workload="shakespeare")


def test_a_workload_gives_its_model_and_its_data_one_way_each():
    with pytest.raises(ValueError, match="'x': give either model or run_model"):
        CustomWorkload(name="x", data=blobs())
    with pytest.raises(ValueError, match="'x': give either data or run_data"):
        CustomWorkload(name="x", model=plain_mlp, data=blobs(), run_data=lambda run, seed: blobs())


def test_the_composition_root_names_no_workload():
    source = FEDERATION.read_text()
    assert not [name for name in BUILTIN_WORKLOADS if f'"{name}"' in source]
