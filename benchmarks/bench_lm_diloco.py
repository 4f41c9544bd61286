"""DiLoCo against single-site training, through the library's own engine: ``SiteTrainer`` (the
batched trainer the emulator and the workers run) with a ``LocalOptimizer`` recipe and per-site
``SiteState``, FedAvg folded by ``StreamingFedAvg``, the outer step by ``round_outcome`` (plain
averaging or ``NesterovOuter``). Same model, data and bytes seen in every row.

The model is nanoGPT's CPU Shakespeare shape (4 layers, 4 heads, width 128, context 64; byte
tokens) on tinyshakespeare's first 90 % as non-overlapping 64-byte windows; every row sees
2,000 x 12 windows (1.5 M bytes) in all. Rows:

- ``single`` (b): one site, batch 12, 2,000 steps, the AdamW recipe (lr 2e-3, betas 0.9/0.99,
  warm-up 100 + cosine to 1e-4, weight decay 0.1, clip 1.0);
- ``single-4x`` (b'): one site, batch 48, 500 steps (warm-up 25): the data-parallel baseline;
- ``diloco-H<h>-kept|reset`` (c): 4 iid sites, batch 12, 500 steps each in rounds of H inner
  steps, outer Nesterov (lr 0.7, momentum 0.9: ``--outer-lr``, ``--outer-momentum``) on the
  averaged pseudo-gradient; inner AdamW moments kept across rounds (DiLoCo) or reset every
  round (the curtailment paper's code);
- ``fedavg-H10``, ``fedavg-H50`` (d): as (c) with kept moments and plain averaging as the outer
  step.

Scored on the WHOLE validation split (last 10 %, ``evaluate_lm``): nats per byte and bits per
byte, with each row's distance to (b') and (b).

    .venv/bin/python benchmarks/bench_lm_diloco.py                   # every row, seed 0
    .venv/bin/python benchmarks/bench_lm_diloco.py --rows single,diloco-H50-kept --steps 200
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.func import functional_call

from powertrip.aggregation.outer_step import make_outer
from powertrip.aggregation.robust import Aggregation
from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.batches import LocalTrainingConfig
from powertrip.learning.datasets.text import load_text, read_corpus
from powertrip.learning.device import to_numpy, to_torch
from powertrip.learning.gpt import GPT
from powertrip.learning.lm_eval import LMEval, evaluate_lm
from powertrip.learning.partition import partition_iid
from powertrip.learning.site_optim import SiteState
from powertrip.learning.trainer import SiteTrainer, get_params
from powertrip.rounds.emulate import site_seed
from powertrip.rounds.outcome import round_outcome

# the plain-loop reference's corpus, model shape and budget (run as a script: its folder is on
# the path)
from bench_lm_recipe import BASE_BATCH, BASE_STEPS, DATA, SHAPE  # isort: skip


@dataclass(frozen=True)
class Row:
    name: str
    sites: int
    batch: int
    inner_steps: int  # H: local steps per round
    outer: str = "nesterov"  # or "fedavg"
    keep_state: bool = True

    def steps(self, base_steps: int) -> int:
        """Each site's steps so all sites together see ``base_steps`` x BASE_BATCH windows."""
        return max(1, round(base_steps * BASE_BATCH / (self.batch * self.sites)))

    def recipe(self, base_steps: int, lr: float) -> LocalOptimizer:
        steps = self.steps(base_steps)
        return LocalOptimizer(
            name="adamw",
            lr=lr,
            betas=(0.9, 0.99),
            weight_decay=0.1,
            schedule="cosine",
            warmup_steps=max(1, steps // 20),  # 100 of 2,000 steps, 25 of 500
            total_steps=steps,
            min_lr_ratio=1e-4 / lr,
            clip_norm=1.0,
            keep_state=self.keep_state,
        )


def all_rows() -> dict[str, Row]:
    rows = [Row("single", 1, 12, 250, "fedavg"), Row("single-4x", 1, 48, 125, "fedavg")]
    for h in (10, 50, 100):
        rows += [
            Row(f"diloco-H{h}-kept", 4, 12, h),
            Row(f"diloco-H{h}-reset", 4, 12, h, keep_state=False),
        ]
    rows += [Row("fedavg-H10", 4, 12, 10, "fedavg"), Row("fedavg-H50", 4, 12, 50, "fedavg")]
    return {r.name: r for r in rows}


def _unscored(params) -> tuple[float, float]:
    """Rounds are scored on the whole validation split at 8 points only (it costs seconds)."""
    return float("nan"), float("nan")


def run_row(row: Row, args: argparse.Namespace, data, val: torch.Tensor) -> tuple[LMEval, list]:
    """Train ``row``; its final evaluation and a curve of (bytes seen, nats per byte)."""
    torch.manual_seed(args.seed)
    model = GPT(data.num_classes, SHAPE)
    steps = row.steps(args.steps)
    recipe = row.recipe(args.steps, args.lr)
    inner = min(row.inner_steps, steps)
    cfg = LocalTrainingConfig(
        lr=args.lr, batch_size=row.batch, optimizer=recipe, max_local_steps=inner
    )
    trainer = SiteTrainer(model, cfg, device="cpu")
    parts = partition_iid(len(data.x_train), row.sites, np.random.default_rng(args.seed))
    outer = make_outer(row.outer, args.outer_lr, args.outer_momentum)
    params = to_numpy(get_params(model), copy=True)
    states: dict[int, SiteState] = {}
    aggregation = Aggregation(args.aggregation)  # robust: its bound goes on round to round
    bound = None
    rounds = steps // inner  # the budget's steps, to a whole number of rounds
    checkpoints = {round(rounds * q / 8) for q in range(1, 9)}
    curve, last = [], None

    def score(p) -> LMEval:
        torch_p = to_torch(p)
        return evaluate_lm(
            lambda x: functional_call(model, torch_p, (x,)), val, SHAPE.context_length
        )

    for r in range(rounds):
        sites = list(range(row.sites))
        upd = trainer.train(
            to_torch(params),
            data.x_train,
            data.y_train,
            [parts[s] for s in sites],
            [site_seed(args.seed, r, s) for s in sites],
            [states[s].for_round(recipe) if s in states else None for s in sites],
        )
        states.update(zip(sites, upd.opt_state, strict=True))
        agg = aggregation.make(params, bound=bound)
        agg.add_rows(to_numpy(upd.deltas), upd.num_samples.astype(np.float64))
        outcome = round_outcome(agg, params, _unscored, selected=len(sites), outer=outer)
        params, bound = outcome.params, outcome.aggregation_state
        if r + 1 in checkpoints:
            last = score(params)
            seen = int(states[0].step) * row.batch * row.sites * SHAPE.context_length
            curve.append((seen, last.nats_per_byte))
            print(
                f"  {row.name}: round {r + 1}/{rounds}, {seen:,} bytes, "
                f"{last.nats_per_byte:.3f} nats/byte",
                file=sys.stderr,
                flush=True,
            )
    assert last is not None
    return last, curve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--rows", default=",".join(all_rows()))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=BASE_STEPS, help="steps at batch 12 (budget)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--outer-lr", type=float, default=0.7, help="Nesterov rows (DiLoCo: 0.7)")
    p.add_argument("--outer-momentum", type=float, default=0.9, help="Nesterov rows (DiLoCo: 0.9)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--aggregation",
        default="fedavg",
        choices=("fedavg", "robust"),
        help="the fold: plain FedAvg (the table's rows) or the library's default robust rule",
    )
    p.add_argument("--json", type=Path, help="write the rows and their curves here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.data.is_file():
        print(f"{args.data}: corpus not found (tinyshakespeare input.txt)", file=sys.stderr)
        return 2
    table = all_rows()
    unknown = [n for n in args.rows.split(",") if n not in table]
    if unknown:
        print(f"unknown rows {unknown}; choose from {', '.join(table)}", file=sys.stderr)
        return 2
    data = load_text(args.data, SHAPE.context_length)
    tokens, _ = read_corpus(args.data)
    val = torch.as_tensor(tokens[len(tokens) - round(len(tokens) * 0.1) :], dtype=torch.long)
    print(
        f"# {SHAPE}; {len(data.x_train):,} training windows; validation: all "
        f"{len(val) - 1:,} predicted bytes; seed {args.seed}; "
        f"{args.steps} x {BASE_BATCH} windows per row; outer Nesterov lr {args.outer_lr}, "
        f"momentum {args.outer_momentum}"
    )
    print(
        f"{'row':<18} {'sites':>5} {'batch':>5} {'H':>4} {'steps':>5} {'outer':>8} "
        f"{'nats/byte':>9} {'bits/byte':>9} {'s/run':>6}"
    )
    results = {}
    for name in args.rows.split(","):
        row = table[name]
        began = time.perf_counter()
        final, curve = run_row(row, args, data, val)
        secs = time.perf_counter() - began
        results[name] = {
            "row": row.__dict__,
            "nats_per_byte": final.nats_per_byte,
            "bits_per_byte": final.bits_per_byte,
            "seconds": secs,
            "curve": curve,
        }
        print(
            f"{name:<18} {row.sites:>5} {row.batch:>5} {row.inner_steps:>4} "
            f"{row.steps(args.steps):>5} {row.outer:>8} {final.nats_per_byte:>9.3f} "
            f"{final.bits_per_byte:>9.3f} {secs:>6.0f}",
            flush=True,
        )
    for ref in ("single-4x", "single"):
        if ref in results:
            base = results[ref]["nats_per_byte"]
            gaps = ", ".join(f"{n} {r['nats_per_byte'] - base:+.3f}" for n, r in results.items())
            print(f"# vs {ref}: {gaps}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
