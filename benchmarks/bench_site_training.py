"""Batched site training (SiteTrainer, vmap over stacked params) vs one plain torch loop per site.

Workload: mnist1d (20k samples, 16k for training), CNN1D, 100 IID sites of 160 samples,
batch 20, lr 0.2, one local epoch (8 SGD steps per site). Both paths see the same batches in
the same order, so their deltas must agree to float rounding; the max abs diff is printed.

    .venv/bin/python benchmarks/bench_site_training.py [--sites 10,50,100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from powertrip.learning.datasets import load_mnist1d  # noqa: E402
from powertrip.learning.device import TorchParams  # noqa: E402
from powertrip.learning.models import build_model  # noqa: E402
from powertrip.learning.partition import partition_iid  # noqa: E402
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params  # noqa: E402

NUM_PARTITIONS, BATCH, LR = 100, 20, 0.2


def train_one_by_one(
    trainer: SiteTrainer,
    model: nn.Module,
    global_params: TorchParams,
    x: torch.Tensor,
    y: torch.Tensor,
    parts: Sequence[np.ndarray],
    seeds: Sequence[int],
) -> TorchParams:
    """Baseline: each site in turn, nn.Module + torch.optim.SGD, same batch schedule."""
    deltas: dict[str, list[torch.Tensor]] = {name: [] for name in global_params}
    for idx, seed in zip(parts, seeds, strict=True):
        model.load_state_dict(global_params)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        for row in trainer._site_schedule(len(idx), seed):  # the order SiteTrainer uses
            rows = idx[row[row >= 0]]
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
            opt.step()
        for name, p in model.named_parameters():
            deltas[name].append(p.detach() - global_params[name])
    return {name: torch.stack(d) for name, d in deltas.items()}


def timed(fn: Callable[[], TorchParams]) -> tuple[float, TorchParams]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", default="10,50,100", help="comma-separated site counts (<=100)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per count (median kept)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    counts = [int(s) for s in args.sites.split(",")]
    if not all(1 <= c <= NUM_PARTITIONS for c in counts) or args.repeats < 1:
        ap.error(f"site counts must be in 1..{NUM_PARTITIONS} and --repeats >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    data = load_mnist1d(num_samples=20000)
    x, y = data.x_train, data.y_train
    parts = partition_iid(len(y), NUM_PARTITIONS, np.random.default_rng(0))
    seeds = list(range(1000, 1000 + NUM_PARTITIONS))
    model = build_model("cnn1d", data.num_classes, data.in_shape)
    global_params = get_params(model)
    plain = copy.deepcopy(model)  # the baseline's own module
    trainer = SiteTrainer(model, LocalTrainingConfig(lr=LR, batch_size=BATCH), torch.device("cpu"))
    steps = len(trainer._site_schedule(len(parts[0]), seeds[0]))

    def baseline(k: int) -> TorchParams:
        return train_one_by_one(trainer, plain, global_params, x, y, parts[:k], seeds[:k])

    def batched(k: int) -> TorchParams:
        return trainer.train(global_params, x, y, parts[:k], seeds[:k]).deltas

    baseline(2), batched(2)  # warm-up (allocator, vmap tracing caches, lazy imports)
    print(
        f"mnist1d CNN1D, {len(parts[0])} samples/site, batch {BATCH}, {steps} steps/site, "
        f"threads {args.threads}, median of {args.repeats}"
    )
    head = ("sites", "baseline s", "batched s", "speed-up", "base st/s", "batch st/s", "max|dd|")
    print("{:>5} {:>11} {:>10} {:>9} {:>10} {:>11} {:>9}".format(*head))
    for k in counts:
        t_base, t_batch = [], []
        for _ in range(args.repeats):  # interleaved so load changes hit both paths alike
            tb, d_base = timed(lambda k=k: baseline(k))
            tv, d_batch = timed(lambda k=k: batched(k))
            t_base.append(tb)
            t_batch.append(tv)
        diff = max(float((d_base[n] - d_batch[n]).abs().max()) for n in d_base)
        mb, mv = statistics.median(t_base), statistics.median(t_batch)
        work = k * steps
        print(
            f"{k:>5} {mb:>11.3f} {mv:>10.3f} {mb / mv:>8.2f}x {work / mb:>10.0f} "
            f"{work / mv:>11.0f} {diff:>9.1e}"
        )


if __name__ == "__main__":
    main()
