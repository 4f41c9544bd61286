"""The learning task both Flower apps share: MNIST-1D, its split over the nodes, the model.

Everything comes from powertrip's own code (the offline MNIST-1D generator, the Dirichlet/IID
partitioner, the small 1-D CNN and the site trainer), so the Flower run trains exactly what the
PowerTrip emulator trains. Each process (the ServerApp's, each Ray actor of the ClientApps)
builds the task once and keeps it: Flower calls a ClientApp once per message.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np
import torch

from powertrip.emulate import site_seed
from powertrip.learning.datasets import load_mnist1d
from powertrip.learning.device import array
from powertrip.learning.models import build_model
from powertrip.learning.partition import partition
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params
from powertrip.sites import SiteSet, generate_sites


@dataclass(frozen=True)
class TaskConfig:
    """One run's definition; both apps get the same copy, so they agree on data and sites."""

    nodes: int = 20
    seed: int = 0
    num_samples: int = 8000
    partition: str = "iid"  # or "dirichlet"
    dirichlet_alpha: float = 0.5
    lr: float = 0.2  # powertrip's MNIST-1D default (WORKLOAD_DEFAULTS)
    batch_size: int = 20
    local_epochs: int = 3

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Task:
    trainer: SiteTrainer
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    partitions: list[np.ndarray]
    initial: dict[str, torch.Tensor]


def sites(cfg: TaskConfig) -> SiteSet:
    """The emulated datacenters, one per node: the paper's distances, links and U(0.1, 1) power,
    drawn from the run seed (the server and every node draw the same ones)."""
    return generate_sites(cfg.nodes, np.random.default_rng([cfg.seed, 7]))


@functools.cache
def load_task(cfg: TaskConfig) -> Task:
    """Data, partitions and the initial model, built once per process from ``cfg``."""
    torch.set_num_threads(1)  # the nodes share two cores; one thread each trains fastest
    data = load_mnist1d(num_samples=cfg.num_samples, seed=cfg.seed)
    parts = partition(
        cfg.partition,
        array(data.y_train),
        cfg.nodes,
        np.random.default_rng([cfg.seed, 1]),
        alpha=cfg.dirichlet_alpha,
    )
    torch.manual_seed(cfg.seed)
    model = build_model("cnn1d", data.num_classes, tuple(data.x_train.shape[1:]))
    config = LocalTrainingConfig(cfg.lr, cfg.batch_size, cfg.local_epochs)
    trainer = SiteTrainer(model, config, device="cpu")
    return Task(
        trainer, data.x_train, data.y_train, data.x_test, data.y_test, parts, get_params(model)
    )


def train_node(
    cfg: TaskConfig, node: int, server_round: int, params: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], int, float]:
    """Local epochs of SGD on node ``node``'s partition from ``params``: (new params, samples,
    mean training loss). The batch order is seeded by (run, round, node), as in the emulator."""
    task = load_task(cfg)
    part = task.partitions[node]
    updates = task.trainer.train(
        params, task.x_train, task.y_train, [part], [site_seed(cfg.seed, server_round, node)]
    )
    new = {k: params[k] + updates.deltas[k][0] for k in params}
    return new, int(updates.num_samples[0]), float(updates.loss[0])


def evaluate(cfg: TaskConfig, params: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(accuracy, loss) on the held-out MNIST-1D test set: the server's centralized evaluation."""
    task = load_task(cfg)
    return task.trainer.evaluate(params, task.x_test, task.y_test)
