"""One LLM-sized site update over gRPC: float32 or bfloat16, whole or in per-rank shards.

The models are the project's GPT (``powertrip/learning/gpt.py``) at vocab 50304: ``medium``
(GPT-2 124M) and ``xl`` (645 M parameters, 568 M of them outside the token embedding), built on
the ``meta`` device, so their shapes cost no memory here. Each configuration is one round of
``bench_upload_rss.run_round`` (imported, not copied): an aggregator child process with a real
gRPC server, the real ``AggregatorServicer`` and ``RoundCollector`` over a float32 global model
of those shapes, and one uploader child process that sends one site's update through the
worker's ``GrpcUploader`` (``bf16=True`` for bfloat16; ``send_shards`` with ``shard_updates`` for
N concurrent shard streams, as N ranks would). The delta varies with the row and is exact in
bfloat16 (``--rows``), so a shard folded at the wrong rows would show, and the new model is
compared with the analytic FedAvg value element by element.

Reported per configuration: seconds per upload (from "go" until the last stream's call returned,
which includes the fold: the aggregator answers once the site is folded), the aggregator's peak
RSS (VmHWM) in GB and its growth over the RSS before the global model existed as a multiple of
the float32 model (the 2.5x target), and whether the model is bit-exact.

    .venv/bin/python benchmarks/bench_llm_upload.py [--sizes medium,xl] [--shards 1,4,8]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_upload_rss import TARGET_X, run_round  # noqa: E402  (benchmarks/ is on the path)

VOCAB = 50304
GB = 1e9


def gpt_shapes(size: str, vocab: int = VOCAB) -> dict[str, tuple[int, ...]]:
    """The GPT's parameter shapes (what the aggregator's template holds), on the meta device."""
    import torch

    from powertrip.learning.gpt import GPT, gpt_shape

    with torch.device("meta"):
        model = GPT(vocab, gpt_shape(size))
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="medium,xl", help="GPT_SIZES names")
    ap.add_argument("--shards", default="1,4,8", help="shard counts (1: one whole stream)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="wire dtypes")
    ap.add_argument("--timeout", type=float, default=900.0, help="per-upload deadline, seconds")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)

    rows = []
    ok = True
    head = (
        "model",
        "params",
        "fp32 GB",
        "wire",
        "shards",
        "upload s",
        "GB/s",
        "peak GB",
        "growth GB",
        "x model",
        "target",
        "model",
    )
    fmt = "{:<7} {:>7} {:>7} {:>5} {:>6} {:>8} {:>6} {:>7} {:>9} {:>7} {:>6}  {}"
    print(fmt.format(*head), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            shapes = gpt_shapes(size)
            path = Path(tmp) / f"{size}.json"
            path.write_text(json.dumps(shapes))
            params = sum(math.prod(s) for s in shapes.values())
            for dtype in args.dtypes.split(","):
                for shards in (int(n) for n in args.shards.split(",")):
                    ns = argparse.Namespace(
                        model_mib=0,
                        tensors=0,
                        uploads=1,
                        timeout=args.timeout,
                        client_procs=1,
                        shapes_file=str(path),
                        bf16=dtype == "bf16",
                        shards=shards,
                        rows=True,
                    )
                    r = run_round("streaming", ns)
                    model_gb = r["model_mib"] * 2**20 / GB
                    growth = (r["peak_mib"] - r["rss_pre_mib"]) * 2**20 / GB
                    wire_gb = model_gb / (2 if dtype == "bf16" else 1)
                    x = growth / model_gb
                    good = r["correct"] and not r["errors"] and r["complete"]
                    ok = ok and good
                    verdict = ("bit-exact" if r["bit_exact"] else "correct") if good else "WRONG"
                    row = {
                        "model": size,
                        "params_m": params / 1e6,
                        "model_gb": model_gb,
                        "wire": dtype,
                        "shards": shards,
                        "upload_s": r["upload_s"],
                        "wire_gb_per_s": wire_gb / r["upload_s"],
                        "peak_gb": r["peak_mib"] * 2**20 / GB,
                        "growth_gb": growth,
                        "x_model": x,
                        "bit_exact": r["bit_exact"],
                        "errors": r["errors"],
                        "fold_s": r["fold_s"],
                        "aggregator_cpu_s": r["cpu_s"],
                        "uploader_cpu_s": r["client_cpu_s"],
                    }
                    rows.append(row)
                    print(
                        fmt.format(
                            size,
                            f"{params / 1e6:.0f}M",
                            f"{model_gb:.2f}",
                            dtype,
                            shards,
                            f"{r['upload_s']:.2f}",
                            f"{row['wire_gb_per_s']:.2f}",
                            f"{row['peak_gb']:.2f}",
                            f"{growth:.2f}",
                            f"{x:.2f}x",
                            "PASS" if x <= TARGET_X else "MISS",
                            verdict,
                        ),
                        flush=True,
                    )
                    if r["errors"] or r["failed"]:
                        print(f"  errors: {r['errors']} failed: {r['failed']}", flush=True)
    print(
        "upload s: one site, from go until the last stream's call returned (the fold included);"
        " GB/s: wire bytes / upload s; growth: aggregator VmHWM - RSS before the global model;"
        f" x model: growth / float32 model (target <= {TARGET_X}x)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
