"""How far can a hostile minority drag the default rule's bound, and what does it buy them?

The ``robust`` rule (``powertrip.aggregation.robust``) decides each round from estimates that
earlier rounds
left, each moved by one bounded geometric step per round. This replays the estimates alone over
50 rounds of 8 updates: honest relative norms drawn around ``--honest`` (log-normal, sigma 0.3),
and ``h`` hostile updates per round whose norm is always above both estimates (their best
strategy to raise them: every hostile norm counts as "above" in both quantile steps). For each
``h`` it prints the clip and zeroing bounds after 10, 25 and 50 rounds (relative to the model's
norm), the growth over the clean run, and the most the hostile updates together could move the
global model in one round (equal weights: ``h / n`` times the clip, relative units), against what
one honest site moves it by (its median norm over ``n``). Deterministic (seed 0); seconds.

    .venv/bin/python benchmarks/robust_drag.py
"""

from __future__ import annotations

import argparse

import numpy as np

from powertrip.aggregation.robust_fedavg import AdaptiveBound


def replay(rounds: int, n: int, hostile: int, honest: float, seed: int) -> list[AdaptiveBound]:
    rng = np.random.default_rng(seed)
    bound, out = AdaptiveBound(), []
    for _ in range(rounds):
        norms = list(honest * rng.lognormal(0.0, 0.3, n - hostile))
        above = 2 * max(bound.clip_norm, bound.zeroing_norm)  # always above both
        bound = bound.after(norms + [above] * hostile)
        out.append(bound)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--sites", type=int, default=8, help="updates per round")
    p.add_argument("--honest", type=float, default=0.05, help="median honest relative norm")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    clean = replay(args.rounds, args.sites, 0, args.honest, args.seed)
    marks = [r for r in (10, 25, 50) if r <= args.rounds]
    print(f"# {args.sites} updates a round, honest relative norms ~{args.honest} (log-normal)")
    print(
        "| hostile | " + " | ".join(f"clip @{r}" for r in marks) + " | clip vs clean @end | "
        "zeroing @end | zeroing vs clean | hostile pull / round | one honest site's pull |"
    )
    print("|---" * (len(marks) + 6) + "|")
    for h in range(0, args.sites // 2):
        run = replay(args.rounds, args.sites, h, args.honest, args.seed)
        end = run[-1]
        clips = " | ".join(f"{run[r - 1].clip_norm:.3f}" for r in marks)
        pull = h / args.sites * end.clip_norm  # equal weights: their share times the clip
        print(
            f"| {h}/{args.sites} | {clips} | x{end.clip_norm / clean[-1].clip_norm:.2f} | "
            f"{end.zeroing_norm:.3g} | x{end.zeroing_norm / clean[-1].zeroing_norm:.3g} | "
            f"{pull:.4f} | {args.honest / args.sites:.4f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
