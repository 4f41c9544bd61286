"""A services round against an emulator round, 8 sites, timed round to round (issue 23).

What a user waits for between two rounds: the emulator's interval between two rounds'
``on_round`` callbacks (one torch thread), the services' between two rounds' lines in the
aggregator's log (``LocalCluster``: profiler, aggregator, 4 workers, a checkpoint every round,
included: the next round's line comes after the previous checkpoint is durable). Same preset
(``quick``), sites, policy (select-all) and rounds on both sides; start-up and the initial
evaluation fall outside every interval. Runs alternate (emulator, services, emulator, ...) so
a change of load hits both. Helpers: ``benchmarks/bench_round_overhead.py``.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench_round_overhead import emulator_round_times, services_round_times

from benchmarks.suite import Row, verdict

TARGET = 1.2  # services s/round over emulator s/round
SITES, WORKERS = 8, 4


def span(times: list[float]) -> str:
    return f"{min(times):.3f}/{statistics.median(times):.3f}/{max(times):.3f}"


def run(quick: bool, ctx: dict[str, Any]) -> list[Row]:
    rounds, repeats = (5, 1) if quick else (12, 3)
    emu: list[float] = []
    svc: list[float] = []
    ratios = []
    for _ in range(repeats):
        e = emulator_round_times(SITES, rounds)
        s = services_round_times(WORKERS, SITES, rounds).round_s
        emu += e
        svc += s
        ratios.append(statistics.median(s) / statistics.median(e))
    e_med, s_med = statistics.median(emu), statistics.median(svc)
    ratio = s_med / e_med
    per_run = ", ".join(f"{r:.2f}x" for r in ratios)
    note = (
        f"ratio = services/emulator (time over time: lower is better); min/median/max s/round: "
        f"emulator {span(emu)}, services {span(svc)} ({len(svc)} intervals each side from "
        f"{repeats} run(s) of {rounds} rounds, {WORKERS} workers, checkpoint included); "
        f"per-run ratios {per_run}"
    )
    return [
        Row(
            f"services round vs emulator round, {SITES} sites",
            s_med,
            "s/round",
            e_med,
            "emulator round",
            ratio,
            f"<= {TARGET:g}x",
            verdict(ratio <= TARGET),
            note,
            spread=(min(svc), max(svc)),
        )
    ]
