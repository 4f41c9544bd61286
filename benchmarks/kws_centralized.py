"""Centralized reference for the keyword-spotting workloads (docs/workloads.md).

One model trained on the whole training set with the study's own pieces: the same loader and
split, the same model and initialisation (``torch.manual_seed(seed)`` then the workload's
model), and the same plain SGD (the batched trainer with one site holding every training clip,
the workload's default lr and batch). One "round" here is one epoch over all clips, which is
what a select-all federated round trains in total, so the two are compared per epoch budget.

    .venv/bin/python benchmarks/kws_centralized.py --workload fsdd \
        --dataset-path "$(.venv/bin/powertrip data fetch fsdd)" --epochs 11
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from powertrip.config.experiment import WORKLOAD_DEFAULTS
from powertrip.learning.datasets import load_speech
from powertrip.learning.models import build_model, num_parameters
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("fsdd", "speech-commands"), default="fsdd")
    parser.add_argument("--dataset-path", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, help="default: the workload's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = load_speech(args.dataset_path, args.workload)
    defaults = WORKLOAD_DEFAULTS[args.workload]
    lr = args.lr or defaults.lr
    torch.manual_seed(args.seed)
    model = build_model("kwt", data.num_classes, data.in_shape)
    trainer = SiteTrainer(model, LocalTrainingConfig(lr=lr, batch_size=defaults.batch_size))
    params = get_params(model)
    everything = [np.arange(len(data.y_train))]
    print(
        f"{args.workload}: {len(data.y_train)} train / {len(data.y_test)} test clips, "
        f"{data.num_classes} classes, {len(data.group_names)} training speakers, "
        f"kwt {num_parameters(model)} parameters, SGD lr {lr}"
    )
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        update = trainer.train(params, data.x_train, data.y_train, everything, [args.seed + epoch])
        params = {name: params[name] + update.deltas[name][0] for name in params}
        acc, loss = trainer.evaluate(params, data.x_test, data.y_test)
        print(
            f"epoch {epoch:3d}  train loss {update.loss[0]:.3f}  test loss {loss:.3f}  "
            f"test accuracy {acc:.4f}  ({time.perf_counter() - start:.1f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
