"""The compiled SGD step (``compile_step``, the default on CUDA) trains exactly what the eager
step trains, to float tolerance; exercised here on the CPU with inductor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from powertrip.learning.compiled_step import row_bucket
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 3))


def test_rows_come_in_power_of_two_buckets_of_at_least_eight():
    assert [row_bucket(n) for n in (1, 7, 8, 9, 16, 17, 100, 128)] == [
        8, 8, 8, 16, 16, 32, 128, 128
    ]  # fmt: skip


def test_the_step_is_compiled_by_default_on_cuda_only():
    cfg = LocalTrainingConfig(lr=0.1, batch_size=4)

    assert not SiteTrainer(_model(), cfg, device="cpu").compiled
    assert SiteTrainer(_model(), cfg, device="cpu", compile_step=True).compiled


@pytest.mark.slow  # one inductor compile, a few seconds
def test_compiled_steps_give_the_eager_deltas_losses_and_steps():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(120, 1, 8, generator=g), torch.randint(0, 3, (120,), generator=g)
    cfg = LocalTrainingConfig(lr=0.3, batch_size=4, local_epochs=2)
    sites = [np.arange(0, 10), np.arange(10, 47), np.arange(50, 57)]  # unequal: batches shrink
    eager = SiteTrainer(_model(), cfg, device="cpu")
    compiled = SiteTrainer(_model(), cfg, device="cpu", compile_step=True)
    start = get_params(eager.model)

    want = eager.train(start, x, y, sites, [1, 2, 3])
    graphs = counters["stats"]["unique_graphs"]
    got = compiled.train(start, x, y, sites, [1, 2, 3])

    assert counters["stats"]["unique_graphs"] == graphs + 1  # compiled (three sites: 8 rows)

    np.testing.assert_array_equal(got.steps, want.steps)
    np.testing.assert_allclose(got.loss, want.loss, rtol=1e-5)
    for name, d in want.deltas.items():
        assert got.deltas[name].shape == d.shape  # padding rows are not returned
        torch.testing.assert_close(got.deltas[name], d, rtol=1e-4, atol=1e-6)
    assert compiled.evaluate(start, x, y) == eager.evaluate(start, x, y)


def test_a_step_that_fails_to_compile_falls_back_to_the_eager_step(caplog):
    """A GPU machine without a working compiler must still train, the same round, eagerly."""
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(40, 1, 8, generator=g), torch.randint(0, 3, (40,), generator=g)
    cfg = LocalTrainingConfig(lr=0.3, batch_size=4)
    sites = [np.arange(0, 20), np.arange(20, 33)]
    eager = SiteTrainer(_model(), cfg, device="cpu")
    broken = SiteTrainer(_model(), cfg, device="cpu", compile_step=True)

    def no_compiler(*args, **kwargs):
        raise RuntimeError("inductor: no C++ compiler found")

    broken._compiled._step = no_compiler
    start = get_params(eager.model)

    want = eager.train(start, x, y, sites, [1, 2])
    got = broken.train(start, x, y, sites, [1, 2])

    assert not broken.compiled
    assert "training eagerly" in caplog.text and "no C++ compiler" in caplog.text
    for name, d in want.deltas.items():
        torch.testing.assert_close(got.deltas[name], d, rtol=0, atol=0)
