"""Peak memory of StreamingFedAvg vs a naive "keep every update, then np.mean" aggregation.

Each (method, K) runs in a fresh subprocess. Updates come from a generator, one at a time, and
the consumer drops its reference before asking for the next, so the only updates alive are the
one being folded and whatever the method itself keeps. Peak RSS growth is VmHWM after the
aggregation minus VmRSS before it (the high-water mark is reset via /proc/self/clear_refs when
the kernel allows; otherwise the ru_maxrss delta, which can under-report).

    .venv/bin/python benchmarks/bench_fedavg_memory.py [--model-mib 64] [--ks 8,32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memprobe import kib, reset_peak  # noqa: E402  (benchmarks/ is on the path)

from powertrip.aggregation.fedavg import StreamingFedAvg  # noqa: E402

MiB = 1 << 20


def updates(shapes: dict[str, tuple[int, ...]], k: int) -> Iterator[dict[str, np.ndarray]]:
    """K float32 updates, built one at a time; update i is filled with the constant i."""
    for i in range(k):
        yield {name: np.full(shape, float(i), dtype=np.float32) for name, shape in shapes.items()}


def child(method: str, k: int, model_mib: int, tensors: int) -> dict[str, float]:
    """One aggregation in this process; returns its peak RSS growth in MiB."""
    n = model_mib * MiB // 4 // tensors
    shapes = {f"t{j}": (n,) for j in range(tensors)}
    template = {name: np.empty(s, dtype=np.float32) for name, s in shapes.items()}  # untouched
    exact = reset_peak()
    before_kib = kib("VmRSS", exact)
    if method == "streaming":
        agg = StreamingFedAvg(template)
        for delta in updates(shapes, k):
            agg.add(delta, 1.0)
            del delta
        mean = agg.mean_delta()
    else:
        kept = []
        for delta in updates(shapes, k):
            kept.append(delta)
            del delta
        mean = {name: np.mean([u[name] for u in kept], axis=0) for name in shapes}
    after_kib = kib("VmHWM", exact)
    expected = (k - 1) / 2
    if not all(np.allclose(a, expected) for a in mean.values()):
        raise AssertionError(f"{method}: wrong mean")
    return {"extra_mib": (after_kib - before_kib) / 1024, "exact": exact}


def run_child(method: str, k: int, model_mib: int, tensors: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", method, "--ks", str(k)]
    cmd += ["--model-mib", str(model_mib), "--tensors", str(tensors)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-mib", type=int, default=64, help="float32 model size in MiB")
    ap.add_argument("--tensors", type=int, default=4, help="tensors the model is split into")
    ap.add_argument("--ks", default="8,32", help="comma-separated numbers of updates K")
    ap.add_argument("--child", choices=["streaming", "naive"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    ks = [int(s) for s in args.ks.split(",")]
    if args.child:
        print(json.dumps(child(args.child, ks[0], args.model_mib, args.tensors)))
        return
    m = args.model_mib
    print(f"float32 model of {m} MiB in {args.tensors} tensors; peak RSS growth per run")
    head = ("K", "model MiB", "stream MiB", "x model", "naive MiB", "x model")
    print("{:>4} {:>10} {:>11} {:>8} {:>10} {:>8}".format(*head))
    exact = True
    for k in ks:
        s = run_child("streaming", k, m, args.tensors)
        v = run_child("naive", k, m, args.tensors)
        exact = exact and s["exact"] and v["exact"]
        print(
            f"{k:>4} {m:>10} {s['extra_mib']:>11.1f} {s['extra_mib'] / m:>7.2f}x "
            f"{v['extra_mib']:>10.1f} {v['extra_mib'] / m:>7.2f}x"
        )
    if not exact:
        print("note: /proc/self/clear_refs not writable; used ru_maxrss deltas (may under-report)")


if __name__ == "__main__":
    main()
