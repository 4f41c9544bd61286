"""Bring your own model, data and partitioner: a ``CustomWorkload`` trains like a built-in one,
because every built-in workload is one too (``powertrip.learning.workloads``).

A workload is three things the rest of PowerTrip never looks inside: a model factory (any
``nn.Module``; one the batched trainer cannot vmap, with normalisation, dropout or buffers,
trains one site at a time, see ``engines.in_turn``), a dataset (the ``Dataset`` record, built from
arrays or a torch ``Dataset`` with the helpers here, or a function of the run's dataset path)
and optionally a partitioner (labels, number of sites, rng -> one index array per site; else
the run's ``partition`` setting). A study, the emulator and the services all use it by name:
``powertrip.register_workload`` in-process, or a ``"package.module:attribute"`` reference that
every service process imports (``POWERTRIP_WORKLOAD``). Labels are integer class ids, one per
sample or per position of a sequence; the trainer minimises cross-entropy unless the workload
brings its own ``loss``, or its own local step (``train_step``). A workload whose data or model
follow the run's settings (its seed and sample cap, the LM's tokenizer and shape, as the
built-ins' do) gives ``run_data`` / ``run_model`` instead. See docs/workloads.md.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from powertrip.config.curtailment import CurtailmentConfig
from powertrip.config.experiment import ExperimentConfig
from powertrip.config.workloads import workload_declaration
from powertrip.learning.datasets.record import Dataset, DatasetError, split_indices

__all__ = [
    "CustomWorkload",
    "Partitioner",
    "RunSettings",
    "dataset_from_arrays",
    "dataset_from_torch",
    "declared_workload",
]

#: labels, number of sites, rng -> one index array per site (no index twice)
Partitioner = Callable[[np.ndarray, int, np.random.Generator], Sequence[np.ndarray]]
#: (logits [B, ...], targets [B, ...]) -> one loss per sample, shape [B]
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: (model holding the site's weights, inputs, targets, lr) -> the batch's loss; updates in place
TrainStep = Callable[[nn.Module, torch.Tensor, torch.Tensor, float], "torch.Tensor | float"]
#: the settings of the run a workload trains in, either study's
RunSettings = ExperimentConfig | CurtailmentConfig


@dataclass(frozen=True)
class CustomWorkload:
    """A model factory, its data and (optionally) how the data is spread over sites.

    ``model`` gets the loaded ``Dataset`` (for ``num_classes`` and ``in_shape``) and returns a
    freshly initialised module: PowerTrip seeds torch before calling it, so every policy and
    every service process starts from the same weights. ``data`` is a ``Dataset`` or a function
    of the run's ``dataset_path`` (None when unset) returning one, read once per process.

    ``loss(logits, targets)`` replaces cross-entropy in local training and in evaluation: it
    must return one loss per sample, shape ``[B]`` (the trainer masks padded rows and averages
    per site), built from torch operations that ``torch.func.vmap`` can batch (no ``.item()``,
    no branching on values). ``train_step(model, x, y, lr)`` replaces the whole local step: it
    gets a private copy of the model holding the site's weights (in training mode) and one
    batch, updates the weights in place and returns the batch's loss; sites then train one at a
    time (``engines.in_turn``) with plain SGD's settings only (no other local optimizer).

    ``run_data(settings, seed)`` replaces ``data`` and ``run_model(settings, data)`` replaces
    ``model`` for a workload that reads the run's settings (``RunSettings``): its sample cap,
    a tokenizer, a model size. ``rank_model(settings, data)`` gives the site engine's rank
    processes a picklable builder of the model (by default a copy of the run's).
    """

    name: str
    model: Callable[[Dataset], nn.Module] | None = None
    data: Dataset | Callable[[Path | None], Dataset] | None = None
    partitioner: Partitioner | None = None
    lr: float = 0.05
    batch_size: int = 20
    description: str = ""
    loss: Loss | None = None
    train_step: TrainStep | None = None
    run_data: Callable[[RunSettings, int], Dataset] | None = None
    run_model: Callable[[RunSettings, Dataset], nn.Module] | None = None
    rank_model: Callable[[RunSettings, Dataset], Callable[[], nn.Module]] | None = None

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name:
            raise ValueError(f"a workload name must be non-empty without ':', got {self.name!r}")
        for given, run in (("model", "run_model"), ("data", "run_data")):
            if (getattr(self, given) is None) == (getattr(self, run) is None):
                raise ValueError(f"workload {self.name!r}: give either {given} or {run}")
        if self.lr <= 0 or self.batch_size < 1:
            raise ValueError(f"workload {self.name!r}: lr and batch_size must be positive")
        for hook in ("loss", "train_step", "run_data", "run_model", "rank_model"):
            if getattr(self, hook) is not None and not callable(getattr(self, hook)):
                raise TypeError(f"workload {self.name!r}: {hook} must be callable")

    def check_loss(self, model: nn.Module, data: Dataset, batched: bool, rows: int = 4) -> None:
        """Call ``loss`` once on the initial model's logits for the first training samples (and
        under ``vmap`` when ``batched``, as the batched trainer does): ValueError, naming the
        workload, unless it gives ``rows`` finite per-sample values."""
        loss = self.loss
        if loss is None:
            return
        n = min(rows, len(data.y_train))
        device = next(model.parameters(), torch.zeros(())).device
        with torch.no_grad():
            x, y = data.x_train[:n].to(device), data.y_train[:n].to(device)
            out = loss(model.eval()(x), y)
        where = f"workload {self.name!r}: loss(logits, targets)"
        if not isinstance(out, torch.Tensor) or out.shape != (n,):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"{where} must return one value per sample, shape ({n},); got {got}")
        if not bool(torch.isfinite(out).all()):
            raise ValueError(f"{where} is not finite on the initial model: {out.tolist()}")
        if batched:  # its gradient, batched over sites as the trainer takes it
            summed = torch.func.grad(lambda logits, targets: loss(logits, targets).sum())
            try:
                with torch.no_grad():
                    torch.func.vmap(summed)(model(x).unsqueeze(0), y.unsqueeze(0))
            except RuntimeError as exc:
                raise ValueError(
                    f"{where}: torch.func.vmap cannot batch it ({str(exc).splitlines()[0]}); "
                    "write it with vmap-friendly torch operations, or give a train_step"
                ) from exc

    def local_step(self) -> Callable[[nn.Module, torch.Tensor, torch.Tensor, float], float]:
        """``train_step`` returning its loss as a float, checked: finite, a number."""
        step, name = self.train_step, self.name
        assert step is not None

        def checked(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float) -> float:
            out = step(model, x, y, lr)
            if isinstance(out, torch.Tensor) and out.numel() == 1:
                out = out.item()
            if not isinstance(out, int | float) or not np.isfinite(out):
                raise ValueError(
                    f"workload {name!r}: train_step must return the batch's finite loss (a number "
                    f"or a one-element tensor), got {out!r}"
                )
            return float(out)

        return checked

    def load_run(self, run: RunSettings, seed: int = 0) -> Dataset:
        """The run's dataset, checked: ``run_data`` of its settings and ``seed``, else ``data``
        (of its ``dataset_path``)."""
        if self.run_data is None:
            return self.load(run.dataset_path)
        return self._checked(self.run_data(run, seed))

    def load(self, dataset_path: Path | None = None) -> Dataset:
        """The dataset, checked: consistent lengths, integer labels in range."""
        if self.data is None:
            raise ValueError(f"workload {self.name!r} reads its data from the run: use load_run")
        return self._checked(self.data(dataset_path) if callable(self.data) else self.data)

    def _checked(self, data: object) -> Dataset:
        if not isinstance(data, Dataset):
            raise DatasetError(
                f"workload {self.name!r}: data must be a powertrip Dataset (see "
                f"dataset_from_arrays), got {type(data).__name__}"
            )
        _check_split(self.name, "train", data.x_train, data.y_train, data.num_classes)
        _check_split(self.name, "test", data.x_test, data.y_test, data.num_classes)
        return data

    def initial_model(self, run: RunSettings, data: Dataset) -> nn.Module:
        """A freshly initialised model for ``data`` (``run_model`` of the run's settings, else
        ``model``), from torch's global seed."""
        if self.run_model is None:
            return self.build_model(data)
        return self._module(self.run_model(run, data))

    def build_model(self, data: Dataset) -> nn.Module:
        if self.model is None:
            raise ValueError(
                f"workload {self.name!r} sizes its model by the run: use initial_model"
            )
        return self._module(self.model(data))

    def rank_model_factory(
        self, run: RunSettings, data: Dataset, model: nn.Module
    ) -> Callable[[], nn.Module]:
        """A picklable builder of the run's ``model`` for the site engine's rank processes:
        ``rank_model``'s, else a copy (the weights are overwritten each round)."""
        if self.rank_model is not None:
            return self.rank_model(run, data)
        if (self.loss or self.train_step) is not None:
            raise ValueError(
                f"workload {self.name!r}: the site engine (POWERTRIP_SITE_RANKS) trains with "
                "cross-entropy; a workload's own loss or train_step needs a one-process worker"
            )
        return partial(copy.deepcopy, model)

    def _module(self, model: object) -> nn.Module:
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"workload {self.name!r}: the model factory returned {type(model).__name__}, "
                "not a torch.nn.Module"
            )
        return model

    def split(
        self, labels: np.ndarray, num_sites: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """The partitioner's split, checked: one non-empty array per site, in range, disjoint."""
        assert self.partitioner is not None
        parts = [np.asarray(p, dtype=np.int64) for p in self.partitioner(labels, num_sites, rng)]
        where = f"workload {self.name!r}: the partitioner"
        if len(parts) != num_sites:
            raise ValueError(f"{where} returned {len(parts)} parts for {num_sites} sites")
        for site, p in enumerate(parts):
            if p.size == 0:
                raise ValueError(f"{where} gave site {site} no samples")
            if p.min() < 0 or p.max() >= len(labels):
                raise ValueError(f"{where} gave site {site} an index outside 0..{len(labels) - 1}")
        together = np.concatenate(parts)
        if np.unique(together).size != together.size:
            raise ValueError(f"{where} gave a sample to more than one site")
        return [np.sort(p) for p in parts]


def _check_split(name: str, side: str, x: torch.Tensor, y: torch.Tensor, classes: int) -> None:
    where = f"workload {name!r}, {side} split"
    if len(x) != len(y) or len(y) == 0:
        raise DatasetError(f"{where}: {len(x)} inputs for {len(y)} labels (need equal, > 0)")
    if y.dtype != torch.int64:
        raise DatasetError(f"{where}: labels must be int64 class ids, got {y.dtype}")
    if int(y.min()) < 0 or int(y.max()) >= classes:
        raise DatasetError(
            f"{where}: labels must lie in 0..{classes - 1}, found {int(y.min())}..{int(y.max())}"
        )


def dataset_from_arrays(
    x_train: Any,
    y_train: Any,
    x_test: Any = None,
    y_test: Any = None,
    *,
    num_classes: int | None = None,
    groups: Any = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    name: str = "custom",
) -> Dataset:
    """A ``Dataset`` from numpy arrays or tensors: inputs as float32 (integer inputs, token
    ids, stay int64), labels as int64 class ids. Without a test split, ``test_fraction`` of
    the samples are held out (seeded). ``groups`` (one id per training sample) enables the
    ``natural`` partition."""
    x = _inputs(x_train)
    y = torch.as_tensor(np.asarray(y_train)).long()
    if len(x) != len(y):
        raise DatasetError(f"dataset {name!r}: {len(x)} inputs for {len(y)} labels")
    g = None if groups is None else np.asarray(groups, dtype=np.int64)
    if (x_test is None) != (y_test is None):
        raise DatasetError(f"dataset {name!r}: give both x_test and y_test, or neither")
    if x_test is None:
        train, test = split_indices(len(y), test_fraction, seed)
        xt, yt = x[test], y[test]
        x, y = x[train], y[train]
        g = None if g is None else g[train]
    else:
        xt = _inputs(x_test)
        yt = torch.as_tensor(np.asarray(y_test)).long()
    if g is not None and len(g) != len(y):
        raise DatasetError(f"dataset {name!r}: {len(g)} group ids for {len(y)} training samples")
    classes = num_classes if num_classes is not None else int(max(y.max(), yt.max())) + 1
    return Dataset(
        name=name,
        task="custom",
        x_train=x,
        y_train=y,
        x_test=xt,
        y_test=yt,
        num_classes=classes,
        groups_train=g,
    )


def _inputs(values: Any) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(values))
    return t.float() if t.is_floating_point() else t.long()


def dataset_from_torch(
    train: torch.utils.data.Dataset,
    test: torch.utils.data.Dataset | None = None,
    **kwargs: Any,
) -> Dataset:
    """A ``Dataset`` from torch datasets yielding ``(input, label)`` pairs, read once into
    memory (the emulator indexes every site's rows on the device; stream-sized data belongs in
    the services, one worker per site). Keyword arguments as ``dataset_from_arrays``."""

    def stack(ds: torch.utils.data.Dataset) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = zip(*(ds[i] for i in range(len(ds))), strict=True)  # type: ignore[arg-type]
        return torch.stack([torch.as_tensor(v) for v in xs]), torch.as_tensor(ys)

    x, y = stack(train)
    xt, yt = stack(test) if test is not None else (None, None)
    return dataset_from_arrays(x, y, xt, yt, **kwargs)


def declared_workload(name: str) -> CustomWorkload:
    """The ``CustomWorkload`` a run's workload name refers to, built-in or a user's (the name
    resolves in ``powertrip.config.workloads``, which holds it without its type)."""
    found = workload_declaration(name)
    if not isinstance(found, CustomWorkload):
        raise ValueError(
            f"workload {name!r}: expected a powertrip.CustomWorkload, got {type(found).__name__}"
        )
    return found
