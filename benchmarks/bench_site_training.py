"""Batched site training (SiteTrainer: stacked chain, or vmap) vs one plain torch loop per site.

Workload: mnist1d (20k samples, 16k for training), CNN1D, 100 IID sites of 160 samples,
batch 20, lr 0.2, ``--steps`` SGD steps per site (default 8, one local epoch). All paths see
the same batches in the same order, so their deltas must agree to float rounding; the max abs
diff between the stacked and the vmapped trainer is printed.

    .venv/bin/python benchmarks/bench_site_training.py [--sites 10,50,100] [--steps 1,10]
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
    ap.add_argument(
        "--steps", default="8", help="comma-separated local steps per site (8 = an epoch)"
    )
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per count (median kept)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    counts = [int(s) for s in args.sites.split(",")]
    step_counts = [int(s) for s in args.steps.split(",")]
    if not all(1 <= c <= NUM_PARTITIONS for c in counts) or args.repeats < 1:
        ap.error(f"site counts must be in 1..{NUM_PARTITIONS} and --repeats >= 1")
    if not all(s >= 1 for s in step_counts):
        ap.error("--steps must be positive")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    data = load_mnist1d(num_samples=20000)
    x, y = data.x_train, data.y_train
    parts = partition_iid(len(y), NUM_PARTITIONS, np.random.default_rng(0))
    seeds = list(range(1000, 1000 + NUM_PARTITIONS))
    model = build_model("cnn1d", data.num_classes, data.in_shape)
    global_params = get_params(model)
    plain = copy.deepcopy(model)  # the baseline's own module
    print(
        f"mnist1d CNN1D, {len(parts[0])} samples/site, batch {BATCH}, threads {args.threads}, "
        f"median of {args.repeats}; st/s = site-steps/s, up/s = site-updates/s"
    )
    head = ("steps", "sites", "1by1 st/s", "vmap st/s", "stack st/s", "stack up/s")
    head += ("stack/vmap", "stack/1by1", "max|dd|")
    print("{:>5} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9}".format(*head))
    for n_steps in step_counts:
        cfg = LocalTrainingConfig(
            lr=LR, batch_size=BATCH, local_epochs=-(-n_steps // 8), max_local_steps=n_steps
        )
        cpu = torch.device("cpu")
        trainers = {"vmap": SiteTrainer(model, cfg, cpu, stacked=False)}
        trainers["stacked"] = SiteTrainer(model, cfg, cpu)
        steps = len(trainers["vmap"]._site_schedule(len(parts[0]), seeds[0]))

        def run(name: str, k: int, trainers: dict[str, SiteTrainer] = trainers) -> TorchParams:
            if name == "one-by-one":
                t = trainers["vmap"]
                return train_one_by_one(t, plain, global_params, x, y, parts[:k], seeds[:k])
            return trainers[name].train(global_params, x, y, parts[:k], seeds[:k]).deltas

        methods = ("one-by-one", "vmap", "stacked")
        for name in methods:  # warm-up (allocator, vmap tracing caches, lazy imports)
            run(name, 2)
        for k in counts:
            times: dict[str, list[float]] = {name: [] for name in methods}
            out: dict[str, TorchParams] = {}
            for _ in range(args.repeats):  # interleaved so load changes hit all paths alike
                for name in methods:
                    t, out[name] = timed(lambda name=name, k=k: run(name, k))
                    times[name].append(t)
            diff = max(float((out["vmap"][n] - out["stacked"][n]).abs().max()) for n in out["vmap"])
            med = {name: statistics.median(t) for name, t in times.items()}
            rate = {name: k * steps / med[name] for name in methods}
            print(
                f"{steps:>5} {k:>5} {rate['one-by-one']:>10.0f} {rate['vmap']:>10.0f} "
                f"{rate['stacked']:>10.0f} {k / med['stacked']:>10.0f} "
                f"{rate['stacked'] / rate['vmap']:>9.2f}x "
                f"{rate['stacked'] / rate['one-by-one']:>9.2f}x {diff:>9.1e}"
            )


if __name__ == "__main__":
    main()
