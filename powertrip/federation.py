"""Turn a dataset and a run configuration into the learning side of a run, for both study modes.

``build_federation``: the PowerTrip study (rounds of local epochs over per-site partitions,
FedAvg weighted by n_i, Eq. 2). ``StreamSetup``: the curtailment study (one shared data stream,
FedAvg weighted by the batches each site processed, as in the work-weighted averaging of the
curtailment-window study, arXiv 2602.22760). The emulator, the aggregator and the workers all
build the learning side here, so they share the model, its initialisation and the data order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from powertrip.aggregation.outer_step import NesterovOuter
from powertrip.aggregation.robust import Aggregation
from powertrip.config.curtailment import CurtailmentConfig
from powertrip.config.experiment import ExperimentConfig, default_lr
from powertrip.curtailment.learner import StreamLearner
from powertrip.curtailment.wall_clock import WallClockRounds
from powertrip.learning.batches import local_steps
from powertrip.learning.custom import CustomWorkload, declared_workload
from powertrip.learning.datasets import Dataset
from powertrip.learning.device import array, resolve_device
from powertrip.learning.partition import partition
from powertrip.learning.site_params import running_statistics
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params
from powertrip.rounds.emulate import Federation

__all__ = ["StreamSetup", "build_federation", "load_workload", "site_model_factory"]


def load_workload(cfg: ExperimentConfig | CurtailmentConfig, seed: int = 0) -> Dataset:
    """The run's dataset, as its workload loads it (``num_samples`` caps a built-in one's
    generated or windowed samples; a custom workload's data is taken as given)."""
    return declared_workload(cfg.workload).load_run(cfg, seed)


def site_model_factory(
    cfg: ExperimentConfig, data: Dataset, model: torch.nn.Module
) -> Callable[[], torch.nn.Module]:
    """A picklable builder of the run's architecture for the site engine's rank processes
    (``model``: the run's model, copied unless the workload builds its own: the language
    model gets ``scaled_dot_product_attention`` there, same parameters and logits)."""
    return declared_workload(cfg.workload).rank_model_factory(cfg, data, model)


def _site_trainer(
    workload: CustomWorkload,
    model: torch.nn.Module,
    local: LocalTrainingConfig,
    device: torch.device,
    data: Dataset,
) -> SiteTrainer:
    """The trainer of ``model``, with the workload's own loss or local step (checked)."""
    if workload.train_step is not None and not local.recipe.plain_sgd:
        raise ValueError(
            f"workload {workload.name!r}: its train_step makes each local step itself; the local "
            f"optimizer must be plain SGD, got {local.recipe.name}"
        )
    step = None if workload.train_step is None else workload.local_step()
    trainer = SiteTrainer(model, local, device=device, loss=workload.loss, train_step=step)
    workload.check_loss(trainer.model, data, batched=trainer.unbatched_reason is None)
    return trainer


def build_federation(
    cfg: ExperimentConfig, data: Dataset, seed: int, device: torch.device | str = "auto"
) -> Federation:
    """Partition the training set over the sites and initialise the model, both from ``seed``;
    the model and the data go to ``device`` once, here (an execution setting, not part of the
    run definition: results on the CPU do not depend on it)."""
    rng = np.random.default_rng([seed, 1])
    workload = declared_workload(cfg.workload)
    if workload.partitioner is not None:
        parts = workload.split(array(data.y_train), cfg.num_sites, rng)
    else:
        parts = partition(
            cfg.partition,
            array(data.y_train),
            cfg.num_sites,
            rng,
            groups=data.groups_train,
            alpha=cfg.dirichlet_alpha,
        )
    torch.manual_seed(seed)
    model = workload.initial_model(cfg, data)
    local = LocalTrainingConfig(
        lr=cfg.learning_rate,
        batch_size=cfg.local_batch_size,
        local_epochs=cfg.local_epochs,
        max_local_steps=cfg.max_local_steps,
    )
    per_round = max(local_steps(local, len(p)) for p in parts)
    # a recipe whose schedule spans the run (the LM's) is fitted to it here, where it is known
    local = replace(local, optimizer=cfg.run_recipe(per_round * cfg.max_rounds))
    local.recipe.check_fits(per_round * cfg.max_rounds, f"{cfg.max_rounds} rounds of {per_round}")
    trainer = _site_trainer(workload, model, local, resolve_device(device), data)
    on = trainer.resident
    return Federation(
        trainer=trainer,
        x_train=on(data.x_train),
        y_train=on(data.y_train),
        x_test=on(data.x_test),
        y_test=on(data.y_test),
        partitions=parts,
        initial_params=get_params(model),
    )


class StreamSetup:
    """Everything a curtailment run's learner needs, built once per study (same init, same
    stream); the aggregator and the workers of the curtailment service build it the same way,
    so they share the model, the trainer settings, the data order and the evaluation set with
    the emulator."""

    def __init__(
        self, cfg: CurtailmentConfig, data: Dataset, device: torch.device | str = "auto"
    ) -> None:
        workload = declared_workload(cfg.workload)
        torch.manual_seed(cfg.seed)
        model = workload.initial_model(cfg, data)
        lr = cfg.lr if cfg.lr is not None else default_lr(cfg.workload, cfg.local_optimizer)
        local = LocalTrainingConfig(
            lr=lr, batch_size=cfg.batch_size, shuffle=False, optimizer=cfg.local_optimizer
        )
        # one site can at most train the whole stream
        stream = local_steps(local, len(data.y_train))
        local.recipe.check_fits(stream, f"the whole stream of {len(data.y_train)} samples")
        self.trainer = _site_trainer(workload, model, local, resolve_device(device), data)
        self.params = get_params(model)
        on = self.trainer.resident  # the data moves to the trainer's device once, here
        self.data = replace(
            data,
            x_train=on(data.x_train),
            y_train=on(data.y_train),
            x_test=on(data.x_test),
            y_test=on(data.y_test),
        )
        self.order = np.random.default_rng([cfg.seed, 2]).permutation(len(data.y_train))
        self.cfg = cfg

    @classmethod
    def load(cls, cfg: CurtailmentConfig, device: torch.device | str = "auto") -> StreamSetup:
        """With the run's workload loaded: how the services build it."""
        return cls(cfg, load_workload(cfg, seed=cfg.seed), device)

    def learner(self) -> StreamLearner:
        """A fresh in-process learner from the initial model (one per run of the study)."""
        d, outer = self.data, self.outer()
        x_test, y_test = self.eval_set
        return StreamLearner(
            self.trainer,
            d.x_train,
            d.y_train,
            x_test,
            y_test,
            self.order,
            self.params,
            outer,
            self.aggregation(),
            self.cfg.codec,
            self.cfg.error_feedback,
        )

    def aggregation(self) -> Aggregation:
        """The run's averaging rule: robust unless ``aggregation: fedavg``, its norms per local
        step (a site's weight is the steps it was given)."""
        statistics = running_statistics(self.trainer.model)
        return Aggregation(self.cfg.aggregation, per_weight=True, statistics=statistics)

    @property
    def eval_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The held-out set, cut to ``eval_samples`` when set."""
        d, n = self.data, self.cfg.eval_samples
        return (d.x_test, d.y_test) if n is None else (d.x_test[:n], d.y_test[:n])

    def outer(self) -> NesterovOuter | None:
        """The optional DiLoCo-style Nesterov outer step after the averaging (off by default:
        the curtailment study's logged run predates it)."""
        if self.cfg.outer == "nesterov":
            return NesterovOuter(self.cfg.outer_lr, self.cfg.outer_momentum)
        return None

    def wall_clock_rounds(self) -> WallClockRounds:
        """The run's round timing: one full-power site needs ``single_site_hours`` in all."""
        cfg = self.cfg
        steps = math.ceil(len(self.data.y_train) / cfg.batch_size)
        return WallClockRounds(
            cfg.single_site_hours * 3600.0 / steps, cfg.round_min_s, cfg.overhead_s
        )
