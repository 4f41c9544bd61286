"""Bring your own model, data and partitioner: a CustomWorkload trains like a built-in one,
models vmap cannot batch train one site at a time with the same result, and every bad input
is refused with a message naming it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import powertrip as pt
from powertrip.learning.custom import declared_workload
from powertrip.learning.engines import batched_training_blocker, train_sites_in_turn
from powertrip.learning.models import CNN1D
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params
from tests.workloads import blobs, normalised_blobs, normalised_mlp


def test_a_model_vmap_can_batch_gives_the_same_update_one_site_at_a_time():
    torch.manual_seed(0)
    model = CNN1D(num_classes=4, length=40, channels=8)
    trainer = SiteTrainer(model, LocalTrainingConfig(lr=0.1, batch_size=7, local_epochs=2))
    assert trainer.unbatched_reason is None
    x, y = torch.randn(90, 1, 40), torch.randint(0, 4, (90,))
    sites = [np.arange(0, 30), np.arange(30, 41), np.arange(41, 90)]  # uneven, with padding
    state = get_params(model)
    batched = trainer.train(state, x, y, sites, seeds=[1, 2, 3])
    schedules = [
        trainer._site_schedule(len(s), seed) for s, seed in zip(sites, [1, 2, 3], strict=True)
    ]
    in_turn = train_sites_in_turn(model, state, x, y, sites, schedules, 0.1, trainer.device)
    assert np.array_equal(batched.steps, in_turn.steps)
    np.testing.assert_allclose(batched.loss, in_turn.loss, rtol=1e-5)
    for name in state:
        torch.testing.assert_close(batched.deltas[name], in_turn.deltas[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("layer", "reason"),
    [
        (nn.BatchNorm1d(4), "BatchNorm1d"),
        (nn.Dropout(0.5), "Dropout"),
        (nn.LSTM(4, 4), "LSTM"),
    ],
)
def test_normalisation_dropout_and_recurrent_layers_train_one_site_at_a_time(layer, reason):
    assert reason in batched_training_blocker(nn.Sequential(nn.Linear(4, 4), layer))


def test_inactive_dropout_keeps_the_batched_trainer():
    assert batched_training_blocker(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0))) is None


def test_running_statistics_are_state_that_sites_send_and_fedavg_averages():
    data = blobs()
    torch.manual_seed(0)
    model = normalised_mlp(data)
    state = get_params(model)
    assert "1.running_mean" in state and "1.running_var" in state
    assert "1.num_batches_tracked" not in state  # bookkeeping, not averaged
    trainer = SiteTrainer(model, LocalTrainingConfig(lr=0.1, batch_size=16))
    assert "BatchNorm1d" in trainer.unbatched_reason
    out = trainer.train(state, data.x_train, data.y_train, [np.arange(100)], seeds=[0])
    assert out.deltas["1.running_mean"].abs().sum() > 0  # the site's statistics moved


def test_a_normalised_model_learns_in_a_study():
    name = pt.register_workload(normalised_blobs)
    cfg = pt.build_config(
        workload=name,
        num_sites=4,
        policies=("select-all",),
        static_sweep=(),
        target_accuracy=0.9,
        max_rounds=8,
        update_gb=0.01,
    )
    result = pt.run_study(cfg)
    ((_, run),) = result.runs
    assert run.initial_accuracy < 0.5
    assert run.time_to(0.9) is not None, [r.accuracy for r in run.rounds]


def test_a_reference_names_a_workload_or_a_function_returning_one():
    assert declared_workload("tests.workloads:normalised_blobs") is normalised_blobs
    assert declared_workload("tests.workloads:plain_blobs").name == "plain-blobs"
    cfg = pt.build_config(
        workload="tests.workloads:plain_blobs", num_sites=3, static_sweep=(3,), target_accuracy=0.5
    )
    again = type(cfg).model_validate_json(cfg.model_dump_json())  # as the workers receive it
    assert again.workload == "tests.workloads:plain_blobs"
    assert again.learning_rate == 0.1 and again.local_batch_size == 20


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no-such-workload", "unknown workload 'no-such-workload': built-in workloads are mnist1d"),
        ("tests.nowhere:x", "cannot import 'tests.nowhere'"),
        ("tests.workloads:missing", "'tests.workloads' has no 'missing'"),
        ("tests.workloads:blobs", "expected a powertrip.CustomWorkload"),
    ],
)
def test_a_bad_workload_name_is_refused_naming_it(name, message):
    with pytest.raises(ValueError, match="workload") as info:
        pt.build_config(workload=name, static_sweep=())
    assert message in str(info.value)


def test_arrays_become_a_dataset_with_a_held_out_split():
    x, y = np.random.default_rng(0).normal(size=(50, 3)), np.arange(50) % 5
    data = pt.dataset_from_arrays(x, y, test_fraction=0.2)
    assert (len(data.y_train), len(data.y_test)) == (40, 10)
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    assert data.num_classes == 5 and data.in_shape == (3,)
    tokens = pt.dataset_from_arrays(np.zeros((4, 8), dtype=np.int32), [0, 1, 0, 1])
    assert tokens.x_train.dtype == torch.int64  # token ids stay integers


def test_a_torch_dataset_becomes_a_dataset():
    train = torch.utils.data.TensorDataset(torch.randn(20, 2), torch.arange(20) % 2)
    test = torch.utils.data.TensorDataset(torch.randn(6, 2), torch.arange(6) % 2)
    data = pt.dataset_from_torch(train, test)
    assert (len(data.y_train), len(data.y_test), data.num_classes) == (20, 6, 2)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ((np.zeros((5, 2)), [0, 1, 0]), "5 inputs for 3 labels"),
        ((np.zeros((4, 2)), [0, 1, 0, 1], np.zeros((2, 2)), None), "give both x_test and y_test"),
    ],
)
def test_mismatched_arrays_are_refused(arrays, message):
    with pytest.raises(ValueError, match=message):
        pt.dataset_from_arrays(*arrays)


def test_labels_out_of_range_are_refused_naming_the_workload_and_split():
    data = pt.dataset_from_arrays(np.zeros((10, 2)), np.arange(10) % 3, num_classes=2)
    w = pt.CustomWorkload(name="bad-labels", model=normalised_mlp, data=data)
    with pytest.raises(ValueError, match=r"workload 'bad-labels', (train|test) split: labels"):
        w.load()


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        (lambda n, k: [np.arange(n)], "returned 1 parts for 3 sites"),
        (lambda n, k: [np.arange(5), np.arange(4, 9), np.arange(9, n)], "more than one site"),
        (lambda n, k: [np.arange(5), np.array([], int), np.arange(5, n)], "gave site 1 no samples"),
        (lambda n, k: [np.arange(5), np.arange(5, 9), np.arange(9, n + 1)], "outside 0.."),
    ],
)
def test_a_bad_partition_is_refused_naming_the_problem(parts, message):
    w = pt.CustomWorkload(
        name="bad-split",
        model=normalised_mlp,
        data=blobs(60),
        partitioner=lambda labels, k, rng: parts(len(labels), k),
    )
    with pytest.raises(ValueError, match=f"workload 'bad-split': the partitioner.*{message}"):
        w.split(np.zeros(20, dtype=np.int64), 3, np.random.default_rng(0))


def test_a_factory_that_returns_no_module_is_refused():
    w = pt.CustomWorkload(name="no-module", model=lambda d: "a string", data=blobs(60))
    with pytest.raises(TypeError, match="'no-module': the model factory returned str"):
        w.build_model(w.load())
