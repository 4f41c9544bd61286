"""The language-model recipe, measured: a plain single-file training loop over the project's GPT
on tinyshakespeare at nanoGPT's CPU budget (4 layers, 4 heads, width 128, context 64; 2,000
steps of 12 windows = 1.5 M bytes seen), scored on the WHOLE validation split (the last 10 %)
in nats per token and bits per byte.

Three rows, each at the same number of bytes seen: ``sgd`` (the project's current recipe: plain
SGD, lr 0.1 constant, batch 32), ``adamw`` (the recipe found here) and ``adamw-4x`` (that recipe
with 4x the batch and 1/4 the steps: the data-parallel baseline for 4 DiLoCo sites). It is the
reference a library optimizer is checked against, so it keeps no state outside this file.

    .venv/bin/python benchmarks/bench_lm_recipe.py --seeds 0,1  # docs/workloads.md: the table
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from powertrip.fetch import entry_path, get
from powertrip.learning.gpt import GPT, GPTShape
from powertrip.learning.lm_eval import LMEval, evaluate_lm

DATA = entry_path(get("tinyshakespeare"))  # after `powertrip data fetch tinyshakespeare`
SHAPE = GPTShape(n_layer=4, n_head=4, d_model=128, context_length=64)
BASE_STEPS, BASE_BATCH = 2000, 12  # nanoGPT's shakespeare-char CPU budget


@dataclass(frozen=True)
class Recipe:
    name: str
    batch: int
    optimizer: str = "adamw"  # or "sgd"
    lr: float = 2e-3
    min_lr: float = 1e-4
    warmup: int = 100
    schedule: str = "cosine"  # "cosine", "wsd" (constant, then linear to min_lr), "constant"
    decay_fraction: float = 0.2  # wsd: last fraction of the steps
    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 0.1
    decay_all_2d: bool = True  # False: only the blocks' matrices (not the embeddings)
    clip: float | None = 1.0

    def steps(self, base_steps: int) -> int:
        """Steps that see the same bytes as ``base_steps`` steps of the base batch."""
        return max(1, round(base_steps * BASE_BATCH / self.batch))

    def lr_at(self, step: int, steps: int) -> float:
        if self.schedule == "constant":
            return self.lr
        warmup = min(self.warmup, steps // 10)
        if step < warmup:
            return self.lr * (step + 1) / warmup
        if self.schedule == "wsd":
            start = steps - max(1, round(steps * self.decay_fraction))
            frac = max(0.0, (step - start) / max(1, steps - start))
            return self.lr + frac * (self.min_lr - self.lr)
        frac = (step - warmup) / max(1, steps - warmup)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * frac))


def _optimizer(model: GPT, r: Recipe) -> torch.optim.Optimizer:
    if r.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=r.lr)
    decayed = [
        p
        for n, p in model.named_parameters()
        if p.ndim == 2 and (r.decay_all_2d or n.startswith("blocks."))
    ]
    ids = {id(p) for p in decayed}
    rest = [p for p in model.parameters() if id(p) not in ids]
    groups = [
        {"params": decayed, "weight_decay": r.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=r.lr, betas=(r.beta1, r.beta2), fused=False)


def train(r: Recipe, train_ids: torch.Tensor, vocab: int, base_steps: int, seed: int) -> GPT:
    """``r`` for its share of ``base_steps``, on random windows of ``train_ids``."""
    torch.manual_seed(seed)
    model = GPT(vocab, SHAPE, fused_attention=True)
    opt = _optimizer(model, r)
    gen = torch.Generator().manual_seed(seed + 1)
    steps, t = r.steps(base_steps), SHAPE.context_length
    offsets = torch.arange(t)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = r.lr_at(step, steps)
        starts = torch.randint(len(train_ids) - t - 1, (r.batch,), generator=gen)
        x, y = train_ids[starts[:, None] + offsets], train_ids[starts[:, None] + offsets + 1]
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if r.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), r.clip)
        opt.step()
        if (step + 1) % max(1, steps // 4) == 0:  # progress, off the table's stream
            print(
                f"  {r.name} seed {seed}: step {step + 1}/{steps} loss {loss.item():.3f}",
                file=sys.stderr,
                flush=True,
            )
    return model.eval()


def recipes(args: argparse.Namespace) -> dict[str, Recipe]:
    found = Recipe(
        "adamw",
        BASE_BATCH,
        lr=args.lr,
        min_lr=args.min_lr,
        warmup=args.warmup,
        schedule=args.schedule,
        beta2=args.beta2,
        weight_decay=args.weight_decay,
        decay_all_2d=not args.decay_matrices_only,
    )
    return {
        "sgd": Recipe("sgd", 32, optimizer="sgd", lr=0.1, schedule="constant", clip=None),
        "adamw": found,
        "adamw-4x": replace(found, name="adamw-4x", batch=4 * BASE_BATCH, warmup=found.warmup // 4),
    }


_UNITS = ("nats_per_token", "nats_per_byte", "bits_per_byte")


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{min(values):.3f}/{statistics.median(values):.3f}/{max(values):.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--recipes", default="sgd,adamw,adamw-4x")
    p.add_argument("--seeds", default="0")
    p.add_argument("--steps", type=int, default=BASE_STEPS, help="steps at batch 12 (budget)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--schedule", choices=("cosine", "wsd", "constant"), default="cosine")
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--decay-matrices-only", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.data.is_file():
        print(f"{args.data}: corpus not found (tinyshakespeare input.txt)", file=sys.stderr)
        return 2
    raw = args.data.read_bytes()
    ids = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    n_val = round(len(ids) * 0.1)
    train_ids, val_ids = ids[: len(ids) - n_val], ids[len(ids) - n_val :]
    seeds = [int(s) for s in args.seeds.split(",")]
    table = recipes(args)
    print(
        f"# {SHAPE}, {sum(p.numel() for p in GPT(256, SHAPE).parameters()):,} parameters; "
        f"validation: all {len(val_ids) - 1:,} predicted bytes; seeds {seeds}"
    )
    print(f"# adamw: {table['adamw']}")
    print(
        f"{'recipe':<10} {'batch':>5} {'steps':>5} {'bytes_seen':>10} "
        f"{'nats/token':>20} {'nats/byte':>20} {'bits/byte':>20} {'s/run':>6}"
    )
    for name in args.recipes.split(","):
        r = table[name]
        evals: list[LMEval] = []
        began = time.perf_counter()
        for seed in seeds:
            model = train(r, train_ids, 256, args.steps, seed)
            evals.append(evaluate_lm(model, val_ids, SHAPE.context_length))
        secs = (time.perf_counter() - began) / len(seeds)
        steps = r.steps(args.steps)
        cells = [_spread([getattr(e, f) for e in evals]) for f in _UNITS]
        print(
            f"{name:<10} {r.batch:>5} {steps:>5} {steps * r.batch * SHAPE.context_length:>10,} "
            + " ".join(f"{c:>20}" for c in cells)
            + f" {secs:>6.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
