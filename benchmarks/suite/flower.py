"""Emulator vs Flower's simulation engine (``flower_sim.py``, in its own process for Ray), on the
same number of cores: Flower's actors, the emulator's torch threads."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

import torch

from benchmarks.suite import BENCH, Row, verdict
from benchmarks.suite.training import SITES, STEPS, emulator_rates

TARGET_X = 20.0


def run_flower(sites: int, rounds: int, workers: int) -> dict[str, Any]:
    cmd = [sys.executable, str(BENCH / "suite" / "flower_sim.py"), "--sites", str(sites)]
    cmd += ["--rounds", str(rounds), "--workers", str(workers)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    for line in done.stdout.splitlines():
        if line.startswith("FLOWER_RESULT "):
            return json.loads(line.removeprefix("FLOWER_RESULT "))
    raise RuntimeError(f"the Flower simulation gave no result:\n{done.stderr[-3000:]}")


def run(quick: bool, ctx: dict[str, Any]) -> list[Row]:
    sites, rounds = (20, 2) if quick else (SITES, ctx.get("flower_rounds", 4))
    workers = min(2, os.cpu_count() or 1)
    # The same cores on both sides: Flower runs one ClientApp per actor on one CPU each; the
    # emulator may use as many torch threads, and is timed with 1 and with that many (OpenMP's
    # spinning threads lose on a loaded machine): the faster is its figure.
    threads = torch.get_num_threads()
    by_threads: dict[int, dict[int, float]] = {}
    try:
        for n in sorted({1, workers}):
            torch.set_num_threads(n)
            by_threads[n] = emulator_rates(1 if quick else 3, sites)
    finally:
        torch.set_num_threads(threads)
    best = {steps: max(by_threads, key=lambda n: by_threads[n][steps]) for steps in STEPS}
    emu = {steps: by_threads[best[steps]][steps] for steps in STEPS}
    result = run_flower(sites, rounds, workers)
    failed = {s: result["rounds"][f"failed-{s}"] for s in STEPS}
    if any(failed.values()):
        raise RuntimeError(f"Flower clients failed (replies with errors by step count): {failed}")
    rows = []
    for steps in STEPS:
        timed = result["rounds"][str(steps)][1:] or result["rounds"][str(steps)]
        flower = sites / statistics.median(timed)
        rows.append(
            Row(
                f"training {steps} step(s), {sites} sites: emulator vs Flower {workers} actors",
                emu[steps],
                "site-updates/s",
                flower,
                "Flower simulation",
                emu[steps] / flower,
                f">= {TARGET_X:g}x",
                verdict(emu[steps] / flower >= TARGET_X),
                note=f"emulator on {best[steps]} torch thread(s) ("
                + ", ".join(f"{n}: {r[steps]:.0f}/s" for n, r in by_threads.items())
                + f"); Flower: median of {len(timed)} rounds after the first, "
                "Ray start-up excluded",
            )
        )
    ctx["flower_wall_s"] = result["wall_s"]
    return rows
