"""Custom workloads the tests name by reference ("tests.workloads:<name>"), as a user's package
would be named in POWERTRIP_WORKLOAD: small, deterministic and quick to train."""

from __future__ import annotations

import numpy as np
from torch import nn

import powertrip as pt
from powertrip.learning.workloads import builtin


def blobs(n: int = 1200, dim: int = 12, classes: int = 4, seed: int = 0) -> pt.Dataset:
    """Gaussian clusters, one per class: a linear model separates them almost perfectly."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 2.0, (classes, dim))
    y = rng.integers(0, classes, n)
    x = centres[y] + rng.normal(0.0, 1.0, (n, dim))
    return pt.dataset_from_arrays(x, y, name="blobs", seed=seed)


def normalised_mlp(data: pt.Dataset) -> nn.Module:
    """An MLP with batch normalisation and dropout: the batched trainer cannot vmap it."""
    return nn.Sequential(
        nn.Linear(data.in_shape[0], 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(32, data.num_classes),
    )


def plain_mlp(data: pt.Dataset) -> nn.Module:
    width = data.in_shape[0]
    return nn.Sequential(nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, data.num_classes))


def halves(labels: np.ndarray, num_sites: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Every site gets an equal slice of a shuffled order (a partitioner of the user's own)."""
    return list(np.array_split(rng.permutation(len(labels)), num_sites))


#: referenced as "tests.workloads:normalised_blobs"
normalised_blobs = pt.CustomWorkload(
    name="normalised-blobs",
    model=normalised_mlp,
    data=lambda path: blobs(),
    partitioner=halves,
    lr=0.1,
    batch_size=16,
)


def plain_blobs() -> pt.CustomWorkload:
    """A factory function: references may name one instead of a workload."""
    return pt.CustomWorkload(name="plain-blobs", model=plain_mlp, data=blobs(), lr=0.1)


def blobs_builtin() -> pt.CustomWorkload:
    """A built-in workload's declaration, as a module of ``powertrip.learning.workloads`` would
    write it: the test that adds a built-in lists it in ``BUILTINS`` as "tests.workloads:..."."""
    return builtin(
        "blobs", "Gaussian clusters, an MLP", lambda run, seed: blobs(seed=seed), plain_mlp
    )
