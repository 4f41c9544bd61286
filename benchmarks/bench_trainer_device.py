"""Site-steps per second of the four ways to train a round, on one device, in one run: the
plain vmapped step (``SiteTrainer(stacked=False)``, eager), the stacked chain (the eager
default for a conv/linear chain: batched matmuls, hand-written backward), the compiled step
(``compile_step=True``, the default on CUDA) and one model at a time (``nn.Module`` +
``torch.optim.SGD`` per site).

Workload as in ``bench_site_training.py``: mnist1d CNN1D, IID sites of 160 samples, batch 20,
one local epoch (8 steps per site); data and model resident on ``--device``. Compilation is
done in a warm-up and reported apart; ``max|dd|`` is each method's largest delta difference
from the eager step (float rounding, ~1e-7, shows they did the same work).

    .venv/bin/python benchmarks/bench_trainer_device.py [--device auto|cpu|cuda[:N]]
        [--sites 10,50] [--repeats 3] [--threads 1] [--compile-mode default|reduce-overhead]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_site_training import BATCH, LR, train_one_by_one  # noqa: E402
from powertrip.learning.datasets import load_mnist1d  # noqa: E402
from powertrip.learning.device import TorchParams, resolve_device, scalar  # noqa: E402
from powertrip.learning.models import build_model  # noqa: E402
from powertrip.learning.partition import partition_iid  # noqa: E402
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params  # noqa: E402

NUM_PARTITIONS = 100


def timed(device: torch.device, fn: Callable[[], TorchParams]) -> tuple[float, TorchParams]:
    """Seconds of ``fn`` with the device's queue drained before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


def max_diff(a: TorchParams, b: TorchParams) -> float:
    return max(scalar((a[n].to(b[n].device) - b[n]).abs().max()) for n in b)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto|cpu|cuda[:N]")
    ap.add_argument("--sites", default="10,50", help=f"comma-separated counts (<={NUM_PARTITIONS})")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per count (median kept)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--compile-mode", default="default", help="torch.compile mode")
    args = ap.parse_args(argv)
    counts = [int(s) for s in args.sites.split(",")]
    if not all(1 <= c <= NUM_PARTITIONS for c in counts) or args.repeats < 1:
        ap.error(f"site counts must be in 1..{NUM_PARTITIONS} and --repeats >= 1")
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        ap.error(str(exc))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    data = load_mnist1d(num_samples=20000)
    parts = partition_iid(len(data.y_train), NUM_PARTITIONS, np.random.default_rng(0))
    seeds = list(range(1000, 1000 + NUM_PARTITIONS))
    model = build_model("cnn1d", data.num_classes, data.in_shape)
    plain = copy.deepcopy(model).to(device)  # the one-at-a-time loop's own module
    cfg = LocalTrainingConfig(lr=LR, batch_size=BATCH)
    eager = SiteTrainer(copy.deepcopy(model), cfg, device, compile_step=False, stacked=False)
    stacked = SiteTrainer(copy.deepcopy(model), cfg, device, compile_step=False)
    compiled = SiteTrainer(model, cfg, device, compile_step=True, compile_mode=args.compile_mode)
    x, y = eager.resident(data.x_train), eager.resident(data.y_train)
    start = get_params(eager.model)
    steps = len(eager._site_schedule(len(parts[0]), seeds[0]))

    methods: dict[str, Callable[[int], TorchParams]] = {
        "vmap": lambda k: eager.train(start, x, y, parts[:k], seeds[:k]).deltas,
        "stacked": lambda k: stacked.train(start, x, y, parts[:k], seeds[:k]).deltas,
        "compiled": lambda k: compiled.train(start, x, y, parts[:k], seeds[:k]).deltas,
        "one-by-one": lambda k: train_one_by_one(eager, plain, start, x, y, parts[:k], seeds[:k]),
    }
    warm = {
        name: timed(device, lambda f=f: [f(k) for k in counts])[0] for name, f in methods.items()
    }
    print(
        f"mnist1d CNN1D on {device} ({torch.__version__}), {len(parts[0])} samples/site, "
        f"batch {BATCH}, {steps} steps/site, threads {args.threads}, median of {args.repeats}; "
        f"warm-up incl. compile ({args.compile_mode}): {warm['compiled']:.1f} s"
    )
    head = ("sites", "vmap st/s", "stacked st/s", "compiled st/s", "1-by-1 st/s", "stack/vmap",
            "comp/vmap", "vmap/1-by-1")  # fmt: skip
    widths = (5, 10, 13, 14, 12, 10, 10, 12)
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)), end="")
    print("  max|dd| stack, comp, 1-by-1")
    for k in counts:
        times: dict[str, list[float]] = {name: [] for name in methods}
        out: dict[str, TorchParams] = {}
        for _ in range(args.repeats):  # interleaved so load changes hit every method alike
            for name, f in methods.items():
                t, out[name] = timed(device, lambda f=f, k=k: f(k))
                times[name].append(t)
        rate = {name: k * steps / statistics.median(t) for name, t in times.items()}
        print(
            f"{k:>5} {rate['vmap']:>10.0f} {rate['stacked']:>13.0f} {rate['compiled']:>14.0f} "
            f"{rate['one-by-one']:>12.0f} {rate['stacked'] / rate['vmap']:>9.2f}x "
            f"{rate['compiled'] / rate['vmap']:>9.2f}x {rate['vmap'] / rate['one-by-one']:>11.2f}x"
            f"  {max_diff(out['stacked'], out['vmap']):.1e}, "
            f"{max_diff(out['compiled'], out['vmap']):.1e}, "
            f"{max_diff(out['one-by-one'], out['vmap']):.1e}"
        )


if __name__ == "__main__":
    main()
