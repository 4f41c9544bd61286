"""Every GPU check in one command, one table at the end: whoever first has a GPU verifies the
CUDA paths in one step (CI has none, so these run nowhere else).

Steps, each a subprocess with its own time limit (a step that fails or times out is a row, not
the end of the check):

1. the suite's CUDA tests (``pytest -m gpu``: device boundary, compiled/stacked steps on CUDA,
   the site engine with NCCL ranks);
2. the quick study on CUDA (``powertrip experiment --preset quick --device cuda``), whose
   summary must match the CPU run's decisions (it is printed for comparison, not asserted);
3. the training engines' benchmark on CUDA (``bench_site_training.py``: site-updates/s of
   the stacked, vmap and in-turn engines against a plain loop);
4. the site-engine benchmark on CUDA (``bench_site_engine.py``: tokens/s per GPU and MFU at the
   GPT-2-124M and the 561M shapes, bf16 + compile + fused AdamW, against a plain loop).

    .venv/bin/python benchmarks/gpu_check.py [--output DIR] [--quick]

``--quick`` shrinks the benchmarks (fewer repeats, the 124M shape only) to fit a short lease.
Each step's full output goes to DIR/<step>.log; the exit status is 1 when any step failed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


@dataclass(frozen=True)
class Step:
    name: str
    command: list[str]
    timeout_s: float
    #: lines of the output worth a place in the table (a regex matched per line)
    keep: str


def steps(out: Path, quick: bool) -> list[Step]:
    bench = REPO / "benchmarks"
    repeats = "1" if quick else "3"
    engine = [PY, str(bench / "bench_site_engine.py"), "--device", "cuda", "--repeats", repeats]
    if quick:
        engine += ["--gpu-sizes", "medium"]  # GPT-2 124M only
    return [
        Step(
            "cuda tests",
            [PY, "-m", "pytest", "-q", "-m", "gpu", "-rs", "-p", "no:cacheprovider", "tests"],
            420,
            r"(passed|failed|error)",
        ),
        Step(
            "quick study (cuda)",
            [
                str(Path(PY).with_name("powertrip")),
                "experiment",
                "--preset",
                "quick",
                "--device",
                "cuda",
                "--output",
                str(out / "quick-cuda"),
            ],
            420,
            r"(time-to-accuracy|reached|rounds|TTA|target)",
        ),
        Step(
            "training engines bench (cuda)",
            [PY, str(bench / "bench_site_training.py"), "--device", "cuda", "--sites", "50"]
            + ["--repeats", repeats],
            420,
            r"^\| cnn1d",
        ),
        Step("site engine bench (cuda)", engine, 600, r"(tok/s|tokens/s|MFU|ratio)"),
    ]


def run(step: Step, out: Path) -> tuple[str, float, list[str]]:
    started = time.perf_counter()
    try:
        done = subprocess.run(
            step.command,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=step.timeout_s,
            check=False,
        )
        text, status = done.stdout + done.stderr, "PASS" if done.returncode == 0 else "FAIL"
    except subprocess.TimeoutExpired as exc:
        text = f"{exc.stdout or ''}{exc.stderr or ''}"
        text, status = (text if isinstance(text, str) else text.decode()), "TIMEOUT"
    seconds = time.perf_counter() - started
    log = out / (re.sub(r"\W+", "-", step.name).strip("-") + ".log")
    log.write_text(text)
    kept = [ln.rstrip() for ln in text.splitlines() if re.search(step.keep, ln)]
    return status, seconds, kept[-12:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", type=Path, default=REPO / "results" / "gpu-check")
    ap.add_argument("--quick", action="store_true", help="fewer repeats, the 124M shape only")
    args = ap.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device on this machine; nothing to check")
        return 2
    print(f"# GPU check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    rows = []
    for step in steps(args.output, args.quick):
        print(f"## {step.name}: {' '.join(step.command[1:4])} ...", flush=True)
        status, seconds, kept = run(step, args.output)
        rows.append((step.name, status, seconds, kept))
        print("\n".join(kept) or "(no summary line)", flush=True)
    print("\n| check | result | seconds | figures |\n|---|---|---|---|")
    for name, status, seconds, kept in rows:
        figures = "<br>".join(kept[-6:]).replace("|", "/") or "-"
        print(f"| {name} | {status} | {seconds:.0f} | {figures} |")
    return 0 if all(r[1] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
