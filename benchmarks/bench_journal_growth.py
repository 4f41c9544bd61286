"""Checkpoint cost against run length: the real save path (``checkpoint.save`` with the journal
file, fsyncs and all) driven for N rounds with journal entries shaped like a real run's (20 of
50 sites selected, an outcome with dispersion, projection and split-half probe), without
training. Prints the manifest and journal sizes at a few rounds and the median time of a save
around round 10 and around round N; with the journal outside the manifest both the manifest
size and the save time stay flat while the journal file grows linearly.

    .venv/bin/python benchmarks/bench_journal_growth.py [--rounds 10000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from powertrip.rounds.journal import JournalEntry  # noqa: E402
from powertrip.rounds.loop import RoundOutcome  # noqa: E402
from powertrip.services.aggregator import checkpoint  # noqa: E402
from powertrip.services.aggregator.journal_file import NAME, JournalFile  # noqa: E402

SITES, SELECTED = 50, 20
WINDOW = 100  # saves timed around each measuring point (fsync latency is noisy)


def entry(r: int, rng: np.random.Generator) -> dict:
    """A journal entry with a real run's shape and full-precision floats."""
    selected = tuple(sorted(int(s) for s in rng.choice(SITES, SELECTED, replace=False)))
    f = [float(x) for x in rng.random(9)]
    outcome = RoundOutcome(
        f[0], f[1], (f[2], f[3], float(SELECTED)), SELECTED, f[4], f[5], projection=(f[6], f[7])
    )
    return JournalEntry(r, selected, outcome, unavailable=(3,) if r % 97 == 0 else ()).to_json()


def state(r: int) -> dict:
    return {
        "clock_s": 61.25 * r,
        "accuracy": 0.5 + r * 1e-6,
        "policy": "powertrip",
        "initial": [0.1, 2.3],
    }


def run(directory: Path, rounds: int) -> dict:
    """Save ``rounds`` rounds; the sizes at some rounds and the save times around 10 and N."""
    rng = np.random.default_rng(0)
    params = {"w": np.zeros(256, np.float32), "b": np.zeros(8, np.float32)}
    journal = JournalFile(directory)
    sizes, times = {}, {}
    for r in range(1, rounds + 1):
        journal.extend([entry(r, rng)])
        began = time.perf_counter()
        checkpoint.save(directory, r, params, state(r), journal)
        times[r] = time.perf_counter() - began
        if r in (10, 100, 1000, rounds) or r % 10_000 == 0:
            manifest = directory / f"round-{r:06d}.json"
            sizes[r] = (manifest.stat().st_size, (directory / NAME).stat().st_size)
    early = [times[r] for r in range(1, min(rounds, WINDOW) + 1)]
    late = [times[r] for r in range(max(1, rounds - WINDOW + 1), rounds + 1)]
    return {
        "sizes": sizes,
        "save_s_round_10": statistics.median(early),
        "save_s_round_n": statistics.median(late),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        began = time.perf_counter()
        result = run(Path(tmp), args.rounds)
        total = time.perf_counter() - began
    print(f"{'round':>8} {'manifest B':>11} {'journal B':>11}")
    for r, (m, j) in sorted(result["sizes"].items()):
        print(f"{r:>8} {m:>11} {j:>11}")
    early, late = result["save_s_round_10"], result["save_s_round_n"]
    print(
        f"save (median of {WINDOW}): {early * 1e3:.2f} ms around round 10, "
        f"{late * 1e3:.2f} ms around round {args.rounds} ({late / early:.2f}x); "
        f"{args.rounds} rounds in {total:.1f} s"
    )
    print(json.dumps({"rounds": args.rounds, **result}, default=str))


if __name__ == "__main__":
    main()
