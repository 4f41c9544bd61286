"""Turn a dataset and an experiment configuration into the learning side of an emulated run."""

from __future__ import annotations

import numpy as np
import torch

from powertrip.emulate import Federation
from powertrip.experiment import MODEL_FOR_WORKLOAD, ExperimentConfig
from powertrip.learning.datasets import Dataset, load_dataset
from powertrip.learning.models import build_model
from powertrip.learning.partition import partition
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params, resolve_device


def load_workload(cfg: ExperimentConfig, seed: int = 0) -> Dataset:
    kwargs: dict[str, object] = {"seed": seed}
    if cfg.workload == "mnist1d":
        kwargs["num_samples"] = cfg.num_samples
    elif cfg.workload == "shakespeare":
        kwargs["max_samples"] = cfg.num_samples
    return load_dataset(cfg.workload, cfg.dataset_path, **kwargs)


def build_federation(cfg: ExperimentConfig, data: Dataset, seed: int) -> Federation:
    """Partition the training set over the sites and initialise the model, both from ``seed``."""
    rng = np.random.default_rng([seed, 1])
    parts = partition(
        cfg.partition,
        data.y_train.numpy(),
        cfg.num_sites,
        rng,
        groups=data.groups_train,
        alpha=cfg.dirichlet_alpha,
    )
    torch.manual_seed(seed)
    model = build_model(
        MODEL_FOR_WORKLOAD[cfg.workload],
        num_classes=data.num_classes,
        in_shape=tuple(data.x_train.shape[1:]),
        vocab_size=data.num_classes if data.task == "next-char" else None,
    )
    trainer = SiteTrainer(
        model,
        LocalTrainingConfig(
            lr=cfg.learning_rate,
            batch_size=cfg.local_batch_size,
            local_epochs=cfg.local_epochs,
            max_local_steps=cfg.max_local_steps,
        ),
        device=resolve_device(),
    )
    return Federation(
        trainer=trainer,
        x_train=data.x_train,
        y_train=data.y_train,
        x_test=data.x_test,
        y_test=data.y_test,
        partitions=parts,
        initial_params=get_params(model),
    )
