"""Emulator training throughput (site-updates/s) against one model at a time, same workload.

Workload: mnist1d CNN1D, 100 IID sites of 160 samples (20k generated, 16k for training),
batch 20, lr 0.2, at 1 and at 10 local SGD steps per site. Both paths train and then fold
every site's delta with ``StreamingFedAvg``; the baseline is ``bench_site_training``'s plain
loop (an ``nn.Module`` and ``torch.optim.SGD`` per site, the same batches in the same order).
No evaluation is timed (a Flower round without evaluation is the other baseline).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from benchmarks.suite import Row
from powertrip.aggregation.fedavg import StreamingFedAvg
from powertrip.config.experiment import build_config
from powertrip.federation import build_federation, load_workload
from powertrip.learning.device import TorchParams, row_to_numpy, to_numpy
from powertrip.learning.models import build_model
from powertrip.rounds.emulate import Federation, site_seed

SITES, SAMPLES, BATCH, LR, SEED = 100, 20_000, 20, 0.2, 0
STEPS = (1, 10)


@dataclass
class Workload:
    fed: Federation
    model: nn.Module  # the baseline's own module
    seeds: list[int]


def workload(steps: int, sites: int = SITES, device: str = "cpu") -> Workload:
    """The federation the emulator builds for this config (Flower's clients build the same)."""
    cfg = build_config(
        workload="mnist1d",
        num_samples=SAMPLES,
        partition="iid",
        lr=LR,
        batch_size=BATCH,
        local_epochs=-(-steps // 8),
        max_local_steps=steps,
        num_sites=sites,
        seed=SEED,
        policies=("select-all",),
        static_sweep=(),
        target_accuracy=0.99,
    )
    data = load_workload(cfg, seed=SEED)
    fed = build_federation(cfg, data, SEED, device)
    model = build_model("cnn1d", data.num_classes, data.in_shape).to(device)
    seeds = [site_seed(SEED, 1, i) for i in range(sites)]
    return Workload(fed, model, seeds)


def fold(params: TorchParams, deltas: TorchParams, samples: Any) -> None:
    template = to_numpy(params)
    agg = StreamingFedAvg(template)
    for j in range(len(samples)):
        agg.add(row_to_numpy(deltas, j), float(samples[j]))
    agg.apply(template)


def emulator_round(w: Workload) -> None:
    f = w.fed
    out = f.trainer.train(f.initial_params, f.x_train, f.y_train, f.partitions, w.seeds)
    template = to_numpy(f.initial_params)
    agg = StreamingFedAvg(template)
    agg.add_rows(to_numpy(out.deltas), out.num_samples.astype(float))  # as the emulator folds
    agg.apply(template)
    if f.x_train.is_cuda:
        torch.cuda.synchronize()


def one_by_one_round(w: Workload) -> None:
    from bench_site_training import train_one_by_one

    f = w.fed
    deltas = train_one_by_one(
        f.trainer, w.model, f.initial_params, f.x_train, f.y_train, f.partitions, w.seeds
    )
    fold(f.initial_params, deltas, [len(p) for p in f.partitions])


def _timed(fn: Any, w: Workload) -> float:
    start = time.perf_counter()
    fn(w)
    return time.perf_counter() - start


def emulator_rates(repeats: int, sites: int = SITES, device: str = "cpu") -> dict[int, float]:
    """site-updates/s of the emulator alone at each step count (for the Flower section)."""
    rates = {}
    for steps in STEPS:
        w = workload(steps, sites, device)
        emulator_round(w)  # warm-up
        rates[steps] = sites / statistics.median(_timed(emulator_round, w) for _ in range(repeats))
    return rates


def run(quick: bool, ctx: dict[str, Any]) -> list[Row]:
    sites, repeats = (20, 1) if quick else (SITES, 3)
    rows = []
    ctx["training_sites"] = sites
    for steps in STEPS:
        w = workload(steps, sites)
        emulator_round(w), one_by_one_round(w)  # warm-up
        t_emu, t_one = [], []
        for _ in range(repeats):  # interleaved so load changes hit both paths alike
            t_emu.append(_timed(emulator_round, w))
            t_one.append(_timed(one_by_one_round, w))
        emu = sites / statistics.median(t_emu)
        one = sites / statistics.median(t_one)
        ctx.setdefault("emulator_rate", {})[steps] = emu
        rows.append(
            Row(
                f"training {steps} step(s), {sites} sites: emulator vs one model at a time",
                emu,
                "site-updates/s",
                one,
                "one-by-one loop",
                emu / one,
                spread=(sites / max(t_emu), sites / min(t_emu)),
                note=f"train + StreamingFedAvg fold, median of {repeats}",
            )
        )
    if torch.cuda.is_available():  # GPU figures, only where there is one
        for steps, rate in emulator_rates(repeats, sites, "cuda").items():
            cpu = ctx["emulator_rate"][steps]
            rows.append(
                Row(
                    f"training {steps} step(s), {sites} sites on {torch.cuda.get_device_name()}",
                    rate,
                    "site-updates/s",
                    cpu,
                    "emulator on the CPU",
                    rate / cpu,
                )
            )
    return rows
