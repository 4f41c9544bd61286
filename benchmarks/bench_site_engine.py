"""Tokens per second of one site trained by the site engine (``SiteGroup``: N rank processes,
torch.distributed), against a plain single-process training loop of the same model.

(a) one rank against the plain loop on the same device and threads: the loop is written here
    (GPT, AdamW with weight decay on matrices, clipping, forward/backward/step over the same
    batches); the engine's time is what its caller waits for, a whole ``train_round`` with the
    global model loaded and the update back in host memory. Target: >= 0.95x the loop.
(b) scaling over ranks on the CPU (gloo): 1, 2, ... ranks of one thread each on the same
    global batch; efficiency = tokens/s / (ranks x one rank's tokens/s).
(c) ``--device cuda``: tokens/s per GPU and MFU (6 x params x tokens/s / ``--peak-flops``,
    default the H100's dense bf16 989e12) at GPT-2 124M's shape (``medium``, vocab 50304,
    context 1024) and ``xl``, bf16 autocast, torch.compile and fused AdamW.

    .venv/bin/python benchmarks/bench_site_engine.py [--device auto|cpu|cuda[:N]]
        [--layers 4 --d-model 128 --heads 4 --context 64 --vocab 512] [--batch 16]
        [--steps 10] [--repeats 3] [--threads 1] [--ranks 1,2] [--sections a,b,c]
        [--gpu-sizes medium,xl] [--gpu-batch 16] [--micro-batch 8] [--peak-flops 989e12]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from powertrip.config.recipe import LocalOptimizer, decays  # noqa: E402
from powertrip.learning.device import resolve_device, tensor  # noqa: E402
from powertrip.learning.gpt import GPT, GPTShape, gpt_shape  # noqa: E402
from powertrip.learning.site_engine import SiteEngineConfig, SiteGroup  # noqa: E402
from powertrip.learning.trainer import get_params  # noqa: E402

RECIPE = LocalOptimizer(name="adamw", lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, clip_norm=1.0)


def plain_loop(model_args, x, y, device, bf16: bool, compiled: bool) -> Callable:
    """The honest baseline: one process, one model, torch's AdamW, nothing else."""
    model = GPT(*model_args, fused_attention=True).to(device)
    params = dict(model.named_parameters())
    decay = {n for n, p in params.items() if decays(n, tuple(p.shape))}
    groups = [
        {"params": [p for n, p in params.items() if n in decay], "weight_decay": 0.1},
        {"params": [p for n, p in params.items() if n not in decay], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=RECIPE.lr, betas=RECIPE.betas, fused=device.type == "cuda")
    step_model = torch.compile(model) if compiled else model

    def train(global_params, rows: np.ndarray) -> None:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(global_params[n])
        for row in rows:
            xb, yb = tensor(x[row], device).long(), tensor(y[row], device).long()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = step_model(xb)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), yb.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(params.values()), RECIPE.clip_norm, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return train


def rates(fn: Callable[[], object], tokens: int, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(tokens / (time.perf_counter() - start))
    return out


def fmt(r: Sequence[float]) -> str:
    return f"{min(r):>10.0f} {statistics.median(r):>10.0f} {max(r):>10.0f}"


def setup(vocab: int, shape: GPTShape, batch: int, steps: int, seed: int = 0):
    n = batch * steps
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (n, shape.context_length), generator=g)
    y = torch.roll(x, -1, 1)
    rows = np.random.default_rng(seed).permutation(n).reshape(steps, batch)
    torch.manual_seed(seed)
    start = get_params(GPT(vocab, shape))
    return x, y, rows, start


def section_a(args, device, vocab, shape) -> None:
    x, y, rows, start = setup(vocab, shape, args.batch, args.steps)
    tokens = rows.size * shape.context_length
    cfg = SiteEngineConfig(
        ranks=1, precision=args.precision, compile=args.compile, micro_batch=args.micro_batch
    )
    bf16 = cfg.resolved_precision(device.type) == "bf16"
    compiled = cfg.resolved_compile(device.type)
    torch.set_num_threads(args.threads)
    plain = plain_loop((vocab, shape), x, y, device, bf16, compiled)
    factory = functools.partial(GPT, vocab, shape, fused_attention=True)
    began = time.perf_counter()
    with SiteGroup(factory, x, y, RECIPE, cfg, device=str(device), threads=args.threads) as grp:
        grp.start()
        up = time.perf_counter() - began
        grp.train_round(start, rows)  # warm-up (compiles when asked)
        plain(start, rows)
        got: dict[str, list[float]] = {"plain": [], "engine": []}
        for _ in range(args.repeats):  # interleaved: load changes hit both alike
            got["plain"] += rates(lambda: plain(start, rows), tokens, 1)
            got["engine"] += rates(lambda: grp.train_round(start, rows), tokens, 1)
    ratio = statistics.median(got["engine"]) / statistics.median(got["plain"])
    best = max(got["engine"]) / max(got["plain"])  # the least disturbed runs of each
    print(
        f"\n(a) one site, 1 rank vs a plain loop: GPT {shape.n_layer}x{shape.d_model} "
        f"ctx {shape.context_length} vocab {vocab} ({n_params(vocab, shape) / 1e6:.2f} M params), "
        f"batch {args.batch} x {args.steps} steps/round, {device}, threads {args.threads}, "
        f"bf16 {bf16}, compile {compiled}; engine start-up {up:.1f} s; {args.repeats} repeats"
    )
    head = f"{'method':<22} {'tok/s min':>10} {'median':>10} {'max':>10}"
    print(f"{head} {'ratio':>7} {'max/max':>7}")
    print(f"{'plain loop':<22} {fmt(got['plain'])} {'1.00x':>7} {'1.00x':>7}")
    print(
        f"{'site engine (round)':<22} {fmt(got['engine'])} {ratio:>6.2f}x {best:>6.2f}x"
        f"  (target >= 0.95x)"
    )


def section_b(args, vocab, shape) -> None:
    x, y, rows, start = setup(vocab, shape, args.batch, args.steps)
    tokens = rows.size * shape.context_length
    factory = functools.partial(GPT, vocab, shape, fused_attention=True)
    print(
        f"\n(b) scaling over CPU ranks (gloo, DDP), 1 thread per rank, the same global batch "
        f"{args.batch} x {args.steps} steps; this machine has {os.cpu_count()} cores, so ranks "
        f"beyond that share them"
    )
    head = f"{'ranks':>5} {'tok/s min':>10} {'median':>10} {'max':>10} {'per rank':>9} {'eff':>6}"
    print(f"{head} {'core use':>9}  (CPU s / wall s per rank; < 100%: it waited for a core)")
    one = None
    for n in [int(r) for r in args.ranks.split(",")]:
        cfg = SiteEngineConfig(ranks=n, precision="fp32", compile="off")
        with SiteGroup(factory, x, y, RECIPE, cfg, device="cpu", threads=1) as grp:
            grp.train_round(start, rows)
            r, use = [], []
            for _ in range(args.repeats):
                out = grp.train_round(start, rows)
                r.append(tokens / out.seconds)
                use.append(statistics.mean(out.rank_cpu_seconds) / out.seconds)
        med = statistics.median(r)
        one = one or (med if n == 1 else None)
        eff = f"{med / (n * one):>5.0%}" if one else "  n/a"
        print(f"{n:>5} {fmt(r)} {med / n:>9.0f} {eff:>6} {statistics.median(use):>9.0%}")


def section_c(args, device) -> None:
    print(
        f"\n(c) tokens/s per GPU and MFU on {torch.cuda.get_device_name(device)}: bf16 autocast, "
        f"torch.compile, fused AdamW, peak {args.peak_flops:.3g} FLOP/s"
    )
    print(f"{'shape':<8} {'params':>8} {'ranks':>5} {'tok/s/GPU':>10} {'MFU':>6} {'start s':>8}")
    ranks = min(args.gpu_ranks, torch.cuda.device_count())
    for size in args.gpu_sizes.split(","):
        shape, vocab = gpt_shape(size), 50304
        x, y, rows, start = setup(vocab, shape, args.gpu_batch * ranks, args.gpu_steps)
        tokens = rows.size * shape.context_length
        cfg = SiteEngineConfig(
            ranks=ranks, precision="bf16", compile="on", micro_batch=args.micro_batch
        )
        factory = functools.partial(GPT, vocab, shape, fused_attention=True)
        began = time.perf_counter()
        with SiteGroup(factory, x, y, RECIPE, cfg, device="cuda") as grp:
            grp.train_round(start, rows)  # start-up and compilation
            up = time.perf_counter() - began
            timed = functools.partial(grp.train_round, start, rows)
            r = statistics.median(rates(timed, tokens, args.repeats))
        per_gpu = r / ranks
        mfu = 6 * n_params(vocab, shape) * per_gpu / args.peak_flops
        print(
            f"{size:<8} {n_params(vocab, shape) / 1e6:>7.0f}M {ranks:>5} {per_gpu:>10.0f} "
            f"{mfu:>6.1%} {up:>8.1f}"
        )


def n_params(vocab: int, shape: GPTShape) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(vocab, shape).parameters())


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto|cpu|cuda[:N]")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (the whole site)")
    ap.add_argument("--steps", type=int, default=10, help="steps per round")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (min/median/max)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of (a)'s both sides")
    ap.add_argument("--ranks", default="1,2", help="(b): comma-separated rank counts")
    ap.add_argument("--sections", default="a,b,c", help="which of a,b,c to run (c: CUDA only)")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    ap.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--micro-batch", type=int, default=None, help="sequences per forward pass")
    ap.add_argument("--gpu-sizes", default="medium,xl", help="(c): GPT sizes")
    ap.add_argument("--gpu-batch", type=int, default=16, help="(c): sequences per GPU per step")
    ap.add_argument("--gpu-steps", type=int, default=10, help="(c): steps per round")
    ap.add_argument("--gpu-ranks", type=int, default=1, help="(c): ranks (GPUs) per site")
    ap.add_argument("--peak-flops", type=float, default=989e12, help="(c): peak bf16 FLOP/s")
    args = ap.parse_args(argv)
    if min(args.batch, args.steps, args.repeats, args.threads) < 1:
        ap.error("--batch, --steps, --repeats and --threads must be >= 1")
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        ap.error(str(exc))
    vocab = args.vocab
    shape = GPTShape(args.layers, args.heads, args.d_model, args.context)
    sections = set(args.sections.split(","))
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, device {device}")
    if "a" in sections:
        section_a(args, device, vocab, shape)
    if "b" in sections:
        section_b(args, vocab, shape)
    if "c" in sections:
        if device.type == "cuda":
            section_c(args, device)
        else:
            print("\n(c) skipped: needs --device cuda")


if __name__ == "__main__":
    main()
