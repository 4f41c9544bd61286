"""Runs train on a second device without a GPU: ``meta``, to catch host/device mixing on a CPU CI.

On a CPU-only machine every tensor lives in host memory, so code that mixes a host tensor into
device arithmetic (``torch.zeros(k)`` without ``device=``, ``torch.tensor(...)``), or reads a
device tensor as numpy (``v.numpy()``, ``np.asarray(v)``, a helper that does either), runs
fine, and fails on the first GPU ("Expected all tensors to be on the same device, ... cuda:0
and cpu", "can't convert cuda:0 device type tensor to numpy"). The scan in
``test_device_boundary.py`` only finds such calls when they are written out.

``meta`` is a device every CPU build of torch has: tensors with shapes and dtypes but no data.
Here the federation is built on it (``device="meta"``, as ``--device cuda`` builds it on a GPU),
so the model, the resident training and test data and every per-round tensor live there, and
the same mistakes fail the same way: "Tensor on device cpu is not on the expected device
meta!", "can't convert meta device type tensor to numpy". Only ``powertrip.learning.device``
may read a device tensor, and its one host copy (``device._host``) is given a stand-in here
(zeros of the right shape and dtype), so whole rounds run: train, FedAvg on numpy, evaluate.
Their numbers mean nothing; what is checked is that nothing else crosses.

Meta's own checks are weaker than CUDA's: in-place ops and indexing do not compare devices
(``host_slice += meta_tensor`` and ``host[meta_index]`` pass there, and fail on CUDA). So the
rounds also run under ``SameDevice``, CUDA's rule as a torch function mode: the tensors of one
op share a device, except a 0-dim host scalar, a host index into a device tensor, and the ops
that move data (``to``, ``copy_``). With both, ``loss_sum = torch.zeros(k)`` (no ``device=``)
in the trainer fails here as it does on a GPU.

What it cannot see: a crossing of data that never reaches torch, and device-specific kernels
(dtype support, numerics): those need a GPU run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from powertrip.config.curtailment import build_curtail_config
from powertrip.config.experiment import build_config
from powertrip.config.sites import RoundTimeModel
from powertrip.federation import StreamSetup, build_federation, load_workload
from powertrip.learning import device as boundary
from powertrip.rounds.emulate import Emulator, TimeModel, TrajectoryCache
from powertrip.selection.base import StaticTopK
from powertrip.services.worker.sites_host import SitesHost
from powertrip.sites.profiles import ModelledLinks, StaticPower, generate_sites

META = torch.device("meta")


def _stand_in_host(t: torch.Tensor) -> torch.Tensor:
    """The boundary's host copy, with zeros for a meta tensor (it has no data to copy)."""
    if t.is_meta:
        return torch.zeros(t.shape, dtype=t.dtype)
    return t.detach().cpu()


class SameDevice(TorchFunctionMode):
    """CUDA's device rule for every torch call made while it is active (see the docstring)."""

    MOVES = frozenset(
        {
            torch.Tensor.to,
            torch.Tensor.copy_,
            torch.Tensor.cpu,
            torch._has_compatible_shallow_copy_type,
        }
    )  # the last: nn.Module.to
    INDEXING = frozenset({torch.Tensor.__getitem__, torch.Tensor.__setitem__})

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func not in self.MOVES:
            tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if func in self.INDEXING:  # indices may stay on the host (CUDA allows it)
                index = tree_leaves(args[1])
                tensors = [t for t in tensors if not any(t is i for i in index) or not t.is_cpu]
            devices = {str(t.device) for t in tensors if not (t.is_cpu and t.dim() == 0)}
            if len(devices) > 1:
                raise RuntimeError(
                    f"{getattr(func, '__name__', func)}: expected all tensors to be on the same "
                    f"device, but found at least two devices, {', '.join(sorted(devices))}!"
                )
        return func(*args, **kwargs)


@pytest.fixture(autouse=True)
def meta_boundary(monkeypatch):
    monkeypatch.setattr(boundary, "_host", _stand_in_host)
    with SameDevice():
        yield


@pytest.fixture(scope="module")
def cfg():
    return build_config(None, num_sites=6, num_samples=600, max_rounds=2, ideal_compute_s=10.0)


@pytest.fixture(scope="module")
def data(cfg):
    return load_workload(cfg)


def test_the_federation_is_built_on_the_device_with_its_data_resident(cfg, data):
    fed = build_federation(cfg, data, seed=0, device="meta")

    assert fed.trainer.device == META
    assert all(p.device == META for p in fed.trainer.model.parameters())
    for t in (fed.x_train, fed.y_train, fed.x_test, fed.y_test):
        assert t.device == META  # moved once, here: a round only indexes them
    assert all(p.device == META for p in fed.initial_params.values())


def test_emulated_rounds_cross_between_device_and_host_only_through_the_boundary(cfg, data):
    fed = build_federation(cfg, data, seed=0, device="meta")
    sites = generate_sites(cfg.num_sites, np.random.default_rng(cfg.site_seed))
    tm = TimeModel(cfg.ideal_compute_s, cfg.update_bytes, RoundTimeModel.PER_SITE_MAX)
    em = Emulator(
        fed, sites, StaticPower(sites.base_power), ModelledLinks(sites), tm, 0, TrajectoryCache()
    )

    run = em.run(StaticTopK(3), target_accuracy=None, max_rounds=2)  # trains, folds, evaluates

    assert len(run.rounds) == 2


def test_a_workers_sites_train_on_the_device_and_upload_numpy(cfg):
    host = SitesHost(cfg, run_seed=0, sites=[0, 1, 2], device="meta")

    updates = host.train(host.template, round_index=1, sites=[0, 2])

    assert [u.site for u in updates] == [0, 2]
    assert all(isinstance(v, np.ndarray) for u in updates for v in u.delta.values())


def test_a_curtailment_stream_trains_and_evaluates_on_the_device():
    cfg = build_curtail_config(
        "curtailment-quick", workload="mnist1d", num_samples=400, batch_size=8
    )
    setup = StreamSetup.load(cfg, device="meta")
    learner = setup.learner()

    assert setup.data.x_train.device == META and setup.eval_set[0].device == META
    deltas = learner.train_sites(learner.params, [0, 1], [np.arange(16), np.arange(16, 40)])
    assert len(deltas) == 2 and all(v.device.type == "cpu" for d in deltas for v in d.values())
    assert len(learner.evaluate()) == 2
