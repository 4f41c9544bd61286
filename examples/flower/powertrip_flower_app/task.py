"""The learning task the ServerApp and the ClientApp share: MNIST-1D, its split over the nodes,
the model.

Everything comes from powertrip's own code (the offline MNIST-1D generator, the Dirichlet/IID
partitioner, the small 1-D CNN and the site trainer), so the Flower run trains exactly what the
PowerTrip emulator trains. Each process (the ServerApp's, each Ray actor of the ClientApps)
builds the task once and keeps it: Flower calls a ClientApp once per message. Both build the
same ``TaskConfig`` from the run config (``task_config``), so they agree on data and sites.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from powertrip.config.experiment import build_config
from powertrip.config.recipe import LocalOptimizer
from powertrip.federation import build_federation, load_workload
from powertrip.learning.site_optim import SiteState
from powertrip.learning.trainer import SiteTrainer
from powertrip.rounds.emulate import Federation, site_seed
from powertrip.sites.profiles import SiteSet, generate_sites


@dataclass(frozen=True)
class TaskConfig:
    """One run's task; the ServerApp and every ClientApp build it from the same run config."""

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


def task_config(run_config: Mapping[str, Any], nodes: int) -> TaskConfig:
    """The task of a run config (pyproject.toml's ``[tool.flwr.app.config]`` with the
    ``--run-config`` overrides) over ``nodes`` nodes."""
    return TaskConfig(
        nodes=int(nodes),
        seed=int(run_config["seed"]),
        num_samples=int(run_config["num-samples"]),
        partition=str(run_config["partition"]),
        local_epochs=int(run_config["local-epochs"]),
    )


@functools.cache
def sites(cfg: TaskConfig) -> SiteSet:
    """The emulated datacenters, one per node: the paper's distances, links and U(0.1, 1) power,
    drawn from the run seed (the server and every node draw the same ones)."""
    return generate_sites(cfg.nodes, np.random.default_rng([cfg.seed, 7]))


@functools.cache
def load_task(cfg: TaskConfig) -> Federation:
    """Data, partitions and the initial model, built once per process from ``cfg`` by the
    emulator's own ``build_federation`` (same generator, partitioner, seeds and model)."""
    torch.set_num_threads(1)  # the nodes share two cores; one thread each trains fastest
    run = build_config(
        workload="mnist1d",
        num_samples=cfg.num_samples,
        partition=cfg.partition,
        dirichlet_alpha=cfg.dirichlet_alpha,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        local_epochs=cfg.local_epochs,
        num_sites=cfg.nodes,
        seed=cfg.seed,
        policies=("select-all",),
        static_sweep=(),
        target_accuracy=0.8,
    )
    return build_federation(run, load_workload(run, seed=cfg.seed), cfg.seed, device="cpu")


@functools.cache
def recipe_trainer(cfg: TaskConfig, recipe: LocalOptimizer) -> SiteTrainer:
    """The task's trainer with the server's local optimizer recipe (its lr, when unset, is the
    task's ``lr``), built once per process and recipe; it shares the task's model."""
    base = load_task(cfg).trainer
    return SiteTrainer(base.model, replace(base.config, optimizer=recipe), device=base.device)


def train_node(
    cfg: TaskConfig,
    node: int,
    server_round: int,
    params: dict[str, torch.Tensor],
    recipe: LocalOptimizer | None = None,
    state: SiteState | None = None,
) -> tuple[dict[str, torch.Tensor], int, float, SiteState | None]:
    """Local epochs on node ``node``'s partition from ``params`` with the server's ``recipe``
    (None: plain SGD at ``cfg.lr``), resuming the node's optimizer ``state`` from its earlier
    rounds: (new params, samples, mean training loss, the state to keep; None for plain SGD).
    The batch order is seeded by (run, round, node), as in the emulator."""
    task = load_task(cfg)
    trainer = task.trainer if recipe is None else recipe_trainer(cfg, recipe)
    part, seed = task.partitions[node], site_seed(cfg.seed, server_round, node)
    updates = trainer.train(params, task.x_train, task.y_train, [part], [seed], [state])
    new = {k: params[k] + updates.deltas[k][0] for k in params}
    kept = updates.opt_state[0] if updates.opt_state else None
    return new, int(updates.num_samples[0]), float(updates.loss[0]), kept


def evaluate(cfg: TaskConfig, params: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(accuracy, loss) on the held-out MNIST-1D test set: the server's centralized evaluation."""
    task = load_task(cfg)
    return task.trainer.evaluate(params, task.x_test, task.y_test)
