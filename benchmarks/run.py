"""One command for the speed issue: every section's figures against baselines measured in the
same run, as a table (``name | measured | baseline | ratio | target | PASS/MISS``) and JSON.

    .venv/bin/python benchmarks/run.py [--quick] [--flower] [--json out.json] [--only NAME,...]

Each measured figure is a median; ``[min-max]`` after it is its range over the repeats.
Sections: training, flower (only with --flower: it starts Ray), upload, fold, decision, rounds,
overhead.
``--quick`` shrinks every section (a smoke run, well under a minute without --flower); its
figures are not the ones the targets are about. How to read the table: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.suite import Row  # noqa: E402

SECTIONS = ("training", "flower", "upload", "fold", "intake", "decision", "rounds", "overhead")


def machine() -> dict[str, Any]:
    """What the figures depend on: cores, load, library versions, the device."""
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }
    try:
        import flwr

        info["flwr"] = flwr.__version__
    except ImportError:
        info["flwr"] = None
    return info


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"


def print_rows(rows: Sequence[Row]) -> None:
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.3g}x"
        base = "-" if r.baseline is None else f"{fmt(r.baseline)} ({r.baseline_name})"
        span = "" if r.spread is None else f" [{fmt(r.spread[0])}-{fmt(r.spread[1])}]"
        print(
            f"{r.name} | {fmt(r.measured)}{span} {r.unit} | {base} | {ratio} | {r.target or '-'} | "
            f"{r.verdict or '-'}",
            flush=True,
        )
        if r.note:
            print(f"    {r.note}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shrink everything (smoke run)")
    ap.add_argument("--flower", action="store_true", help="also run the Flower baseline (Ray)")
    ap.add_argument("--json", type=Path, help="write the rows and machine info here")
    ap.add_argument("--only", help=f"comma-separated sections of {','.join(SECTIONS)}")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in this process")
    ap.add_argument("--flower-rounds", type=int, default=4, help="per step count, 1st untimed")
    args = ap.parse_args(argv)
    chosen = args.only.split(",") if args.only else [s for s in SECTIONS if s != "flower"]
    if args.flower and "flower" not in chosen:
        chosen.append("flower")
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    chosen = [s for s in SECTIONS if s in chosen]  # training before flower: flower reuses it
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    info = machine()
    print(f"machine: {json.dumps(info)}" + ("  [--quick: not the target sizes]" * args.quick))
    print("name | measured | baseline | ratio | target | verdict")
    ctx: dict[str, Any] = {"flower_rounds": args.flower_rounds}
    out: dict[str, Any] = {"machine": info, "quick": args.quick, "sections": {}}
    for name in chosen:
        started = time.perf_counter()
        rows = importlib.import_module(f"benchmarks.suite.{name}").run(args.quick, ctx)
        seconds = time.perf_counter() - started
        print_rows(rows)
        out["sections"][name] = {"seconds": seconds, "rows": [r.as_dict() for r in rows]}
    misses = [
        r["name"] for s in out["sections"].values() for r in s["rows"] if r["verdict"] == "MISS"
    ]
    print(f"{len(misses)} target(s) missed" + (f": {'; '.join(misses)}" if misses else ""))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
