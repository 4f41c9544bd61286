"""Local training engines against one plain torch loop per site, in one run.

For the built-in CNN1D and for a user's own ``nn.Module`` (``UserCNN`` below: its own class and
``forward``, as a ``CustomWorkload`` brings it; ``UserSkipCNN``: the same with a skip
connection, which no layer chain covers), one round of local training of ``--sites``
sites at each of ``--steps`` local steps, by every engine that can run the model, and by the
baseline: a plain loop that trains the sites one after another, each with an ``nn.Module`` and
``torch.optim.SGD``. Every method sees the same batches in the same order, so their deltas
agree to float rounding (``max|dd|``, against the baseline's).

Workload: mnist1d (20k samples, 16k for training), 100 IID sites of 160 samples, batch 20,
lr 0.2. Methods are interleaved within each repeat so load changes hit all alike; rates are
site-updates per second (whole local trainings), min / median / max over ``--repeats``; the
ratio is against the baseline's median (and max against max) from the same process.

    .venv/bin/python benchmarks/bench_site_training.py [--sites 100] [--steps 1,10]
        [--models cnn1d,user,user-skip] [--engines auto,vmap,stacked,in-turn] [--repeats 5]
        [--device cpu|cuda]
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
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from powertrip.learning.batches import site_schedule  # noqa: E402
from powertrip.learning.datasets import load_mnist1d  # noqa: E402
from powertrip.learning.device import TorchParams, resolve_device, scalar  # noqa: E402
from powertrip.learning.models import build_model  # noqa: E402
from powertrip.learning.partition import partition_iid  # noqa: E402
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params  # noqa: E402

NUM_PARTITIONS, BATCH, LR = 100, 20, 0.2
ENGINES = ("vmap", "stacked", "in-turn")


class UserCNN(nn.Module):
    """A user's own model: a small 1-D CNN with a hidden linear layer, written as its own class
    (no buffers, no dropout: it trains batched; its forward is a chain of layers)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, length: int = 40) -> None:
        super().__init__()
        self.conv_a = nn.Conv1d(in_channels, 16, 5, stride=2, padding=2)
        self.conv_b = nn.Conv1d(16, 32, 3, stride=2, padding=1)
        self.hidden = nn.Linear(32 * (length // 4), 64)
        self.out = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv_b(F.relu(self.conv_a(x))))
        return self.out(F.relu(self.hidden(h.flatten(1))))


class UserSkipCNN(UserCNN):
    """The same layers with a skip connection around the hidden layer: not a chain."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, length: int = 40) -> None:
        super().__init__(num_classes, in_channels, length)
        self.hidden = nn.Linear(32 * (length // 4), 32 * (length // 4))
        self.out = nn.Linear(32 * (length // 4), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv_b(F.relu(self.conv_a(x)))).flatten(1)
        return self.out(h + F.relu(self.hidden(h)))


def train_one_by_one(
    trainer: SiteTrainer,
    model: nn.Module,
    global_params: TorchParams,
    x: torch.Tensor,
    y: torch.Tensor,
    parts: Sequence[np.ndarray],
    seeds: Sequence[int],
) -> TorchParams:
    """Baseline: each site in turn, nn.Module + torch.optim.SGD, ``trainer``'s batch schedule."""
    deltas: dict[str, list[torch.Tensor]] = {name: [] for name in global_params}
    for idx, seed in zip(parts, seeds, strict=True):
        model.load_state_dict(global_params)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        for row in site_schedule(trainer.config, len(idx), seed):  # the engines' order
            rows = idx[row[row >= 0]]
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
            opt.step()
        for name, p in model.named_parameters():
            deltas[name].append(p.detach() - global_params[name])
    return {name: torch.stack(d) for name, d in deltas.items()}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return scalar((a.to(b.device) - b).abs().max())


#: one round of k sites: (k) -> their deltas
Round = Callable[[int], TorchParams]


def engine_rounds(
    model: nn.Module,
    cfg: LocalTrainingConfig,
    device: torch.device,
    names: Sequence[str],
    start: TorchParams,
    data: tuple[torch.Tensor, torch.Tensor, list[np.ndarray], list[int]],
) -> dict[str, Round]:
    """A round function for each engine in ``names`` that can run ``model`` (in its order)."""
    x, y, parts, seeds = data
    out: dict[str, Round] = {}
    for name in names:
        try:
            trainer = SiteTrainer(copy.deepcopy(model), cfg, device, engine=name)
        except ValueError as exc:  # this engine cannot run this model
            print(f"  ({name}: {exc})")
            continue
        out[f"{name} ({trainer.engine.name})" if name == "auto" else name] = lambda k, t=trainer: (
            t.train(start, x, y, parts[:k], seeds[:k]).deltas
        )
    return out


def timed(fn: Round, k: int, device: torch.device) -> tuple[float, TorchParams]:
    """Seconds of ``fn(k)``, the device's queue drained before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    begin = time.perf_counter()
    out = fn(k)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - begin, out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", type=int, default=100, help=f"sites per round (<={NUM_PARTITIONS})")
    ap.add_argument("--steps", default="1,10", help="comma-separated local steps per site")
    ap.add_argument(
        "--models", default="cnn1d,user,user-skip", help="cnn1d (built-in), user, user-skip"
    )
    ap.add_argument("--engines", default=",".join(("auto", *ENGINES)), help="engine names")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds per method")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--device", default="cpu", help="cpu|cuda[:N]|auto: data and models there")
    args = ap.parse_args(argv)
    step_counts = [int(s) for s in args.steps.split(",")]
    if not 1 <= args.sites <= NUM_PARTITIONS or args.repeats < 1 or min(step_counts) < 1:
        ap.error(f"--sites in 1..{NUM_PARTITIONS}, --repeats and --steps >= 1")
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        ap.error(str(exc))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    data = load_mnist1d(num_samples=20000)
    x, y = data.x_train.to(device), data.y_train.to(device)
    parts = partition_iid(len(y), NUM_PARTITIONS, np.random.default_rng(0))
    seeds = list(range(1000, 1000 + NUM_PARTITIONS))
    models = {
        "cnn1d": build_model("cnn1d", data.num_classes, data.in_shape),
        "user": UserCNN(data.num_classes, data.in_shape[0], data.in_shape[1]),
        "user-skip": UserSkipCNN(data.num_classes, data.in_shape[0], data.in_shape[1]),
    }
    k = args.sites
    print(
        f"mnist1d on {device}, {k} sites of {len(parts[0])} samples, batch {BATCH}, lr {LR}, "
        f"threads {args.threads}, torch {torch.__version__}; site-updates/s over {args.repeats} "
        "repeats; "
        "ratio: median / the plain loop's median (max / its max)"
    )
    print("| model | steps | method | min | median | max | ratio (median) | ratio (max) |", end="")
    print(" max abs dd |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model_name in args.models.split(","):
        model = models[model_name].to(device)
        start = get_params(model)
        plain = copy.deepcopy(model)  # the baseline's own module
        for n_steps in step_counts:
            cfg = LocalTrainingConfig(
                lr=LR, batch_size=BATCH, local_epochs=-(-n_steps // 8), max_local_steps=n_steps
            )
            ref = SiteTrainer(copy.deepcopy(model), cfg, device)
            methods: dict[str, Round] = {
                "plain loop": lambda k, r=ref, p=plain, s=start: train_one_by_one(
                    r, p, s, x, y, parts[:k], seeds[:k]
                )
            }
            engines = args.engines.split(",")
            methods.update(engine_rounds(model, cfg, device, engines, start, (x, y, parts, seeds)))
            for fn in methods.values():  # warm-up (allocator, tracing caches, compilation)
                fn(k)
            times: dict[str, list[float]] = {name: [] for name in methods}
            out: dict[str, TorchParams] = {}
            for _ in range(args.repeats):  # interleaved so load changes hit all alike
                for name, fn in methods.items():
                    t, out[name] = timed(fn, k, device)
                    times[name].append(t)
            base = [k / t for t in times["plain loop"]]
            for name, ts in times.items():
                rates = [k / t for t in ts]
                dd = max(max_diff(out[name][n], out["plain loop"][n]) for n in start)
                print(
                    f"| {model_name} | {n_steps} | {name} | {min(rates):,.0f} | "
                    f"{statistics.median(rates):,.0f} | {max(rates):,.0f} | "
                    f"{statistics.median(rates) / statistics.median(base):.2f}x | "
                    f"{max(rates) / max(base):.2f}x | {dd:.0e} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
