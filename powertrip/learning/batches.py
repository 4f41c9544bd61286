"""Which samples each site trains on, step by step: the local SGD schedule of a round.

A site's batches depend only on its own partition, the run's training settings and its seed
(never on the other sites of the round), so the batched trainer, the per-site fallback and a
worker training one site all take the same steps. ``round_batches`` lays the round's sites out
for one batched step at a time: longest schedules first, so the sites still training at step
``s`` are a prefix (the batch shrinks as sites finish), and each step only as wide as its
fullest site (padding rows cost no compute).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.batch_orders import epoch_orders

__all__ = [
    "LocalTrainingConfig",
    "RoundBatches",
    "local_steps",
    "round_batches",
    "round_orders",
    "site_schedule",
]


#: each site's seed (its batch order): a list, or the int64 vector ``site_seeds`` draws at once
Seeds = Sequence[int] | np.ndarray


@dataclass(frozen=True)
class LocalTrainingConfig:
    lr: float
    batch_size: int
    local_epochs: int = 1
    max_local_steps: int | None = None  # cap per round, for very large partitions
    shuffle: bool = True  # False: batches in the given row order (the elastic data cursor's)
    #: the local optimizer; None: plain SGD at ``lr`` (its lr, when unset, is ``lr`` too)
    optimizer: LocalOptimizer | None = None

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.batch_size < 1 or self.local_epochs < 1:
            raise ValueError("learning rate, batch size and local epochs must be positive")
        if self.max_local_steps is not None and self.max_local_steps < 1:
            raise ValueError("max_local_steps must be >= 1 when set")

    @property
    def recipe(self) -> LocalOptimizer:
        """The resolved local optimizer: ``optimizer`` with ``lr`` filled in, or plain SGD."""
        return (self.optimizer or LocalOptimizer()).with_lr(self.lr)


def local_steps(config: LocalTrainingConfig, n: int) -> int:
    """The steps of one round of a site with ``n`` samples (``site_schedule``'s rows)."""
    steps = config.local_epochs * math.ceil(n / config.batch_size)
    return steps if config.max_local_steps is None else min(steps, config.max_local_steps)


def site_schedule(config: LocalTrainingConfig, n: int, seed: int) -> np.ndarray:
    """[steps, B] positions in a site's partition of ``n`` samples (-1 = padding)."""
    b = config.batch_size
    rng = np.random.default_rng(seed)
    per_epoch = math.ceil(n / b)
    rows = []
    for _ in range(config.local_epochs):
        perm = np.full(per_epoch * b, -1, dtype=np.int64)
        perm[:n] = rng.permutation(n) if config.shuffle else np.arange(n)
        rows.append(perm.reshape(per_epoch, b))
    sched = np.concatenate(rows)
    if config.max_local_steps is not None:
        sched = sched[: config.max_local_steps]
    return sched


@dataclass(frozen=True)
class RoundBatches:
    steps: np.ndarray  # [k] steps per site, in the order the sites were given
    order: np.ndarray  # batch row -> given site (longest schedule first)
    active: list[int]  # sites still training at each step (a prefix of the rows)
    gather: np.ndarray  # [steps, rows, B] sample indices into the training set
    mask: np.ndarray  # [steps, rows, B] 1.0 for a real sample, 0.0 for padding
    widths: list[int]  # columns of ``gather`` each step needs (its fullest site's samples)


def round_orders(config: LocalTrainingConfig, sizes: NDArray, seeds: Seeds) -> NDArray:
    """[k, epochs, max(sizes)] positions: site i's order in each local epoch (-1 past its
    ``sizes[i]`` samples), exactly ``site_schedule``'s: ``default_rng(seed).permutation(n)``
    per epoch. Drawn for all sites in one vectorised call (``batch_orders``) when that is
    cheaper than a generator per site (many sites, short partitions)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    k, width, epochs = sizes.size, int(sizes.max()), config.local_epochs
    cols = np.arange(width)
    if not config.shuffle:
        return np.broadcast_to(
            np.where(cols < sizes[:, None], cols, -1)[:, None], (k, epochs, width)
        )
    seeds_a = np.asarray(seeds, dtype=object)
    in_range = all(isinstance(s, (int, np.integer)) and 0 <= s < 2**32 for s in seeds_a.tolist())
    # one Fisher-Yates step over all sites costs ~40 array operations; a generator ~60 us
    if in_range and epochs * width * 40 * (2e-6 + 1e-8 * k) < 60e-6 * k:
        return epoch_orders(np.asarray(seeds, dtype=np.int64), sizes, epochs)
    out = np.full((k, epochs, width), -1, dtype=np.int64)
    for i, (n, seed) in enumerate(zip(sizes.tolist(), seeds_a.tolist(), strict=True)):
        rng = np.random.default_rng(seed)
        for e in range(epochs):
            out[i, e, :n] = rng.permutation(n)
    return out


def round_batches(
    config: LocalTrainingConfig,
    site_indices: Sequence[np.ndarray],
    seeds: Seeds,
    rows: int,
    fixed_width: bool = False,
    orders: NDArray | None = None,
) -> RoundBatches:
    """Every step of the round for ``rows`` batch rows (>= the number of sites: a compiled step
    pads to a bucket); ``fixed_width`` keeps every step at the full batch size (fixed shapes).
    ``orders``: the sites' ``round_orders`` when the caller drew them already (all of a round's
    sites at once); laid out without a per-site loop, the same arrays ``site_schedule`` gives."""
    sizes = np.array([len(idx) for idx in site_indices], dtype=np.int64)
    if orders is None:
        orders = round_orders(config, sizes, seeds)
    b, epochs, width = config.batch_size, orders.shape[1], orders.shape[2]
    per_epoch = -(-sizes // b)
    steps = epochs * per_epoch
    if config.max_local_steps is not None:
        steps = np.minimum(steps, config.max_local_steps)
    # Dirichlet partitions differ in size by 10x and more: finished sites leave the batch.
    order = np.argsort(-steps, kind="stable")
    active = [int((steps > s).sum()) for s in range(int(steps.max()))]
    pos = np.empty_like(order)
    pos[order] = np.arange(order.size)
    # every (site, epoch, position) of the orders: its step, batch row and column
    p = np.arange(width)
    step = np.arange(epochs)[:, None] * per_epoch[:, None, None] + p // b  # [k, epochs, width]
    keep = (orders >= 0) & (step < steps[:, None, None])
    site = np.broadcast_to(np.arange(sizes.size)[:, None, None], keep.shape)[keep]
    first = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    samples = np.concatenate([np.asarray(i, dtype=np.int64) for i in site_indices])
    gather = np.zeros((len(active), rows, b), dtype=np.int64)
    mask = np.zeros((len(active), rows, b), dtype=np.float32)
    at = (step[keep], pos[site], np.broadcast_to(p % b, keep.shape)[keep])
    gather[at] = samples[first[site] + orders[keep]]
    mask[at] = 1.0
    # Valid rows are a prefix of every batch (padding only ends a site's last batch).
    counts = mask.sum(2).astype(np.int64)
    widths = [b if fixed_width else int(counts[s, :a].max()) for s, a in enumerate(active)]
    return RoundBatches(steps, order, active, gather, mask, widths)
