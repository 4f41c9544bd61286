"""FedAvg fold bandwidth on every path against memcpy (``np.copyto``) of the same bytes.

``StreamingFedAvg.add`` (whole update, validated) and ``add_pieces`` (slices of the
aggregator's chunk size, with the direction sketch the default policy makes it keep) on a
float32 model of 4 tensors; the emulator's round aggregation as ``Emulator._train_round`` does
it (every row of the stacked deltas into the FedAvg and every other row into the split-half
probe) on 100 sites of the mnist1d CNN1D. Bandwidth = update bytes folded per second; the
ratio compares memory traffic (a fold reads the update and reads and writes the accumulator,
3 bytes per update byte; a memcpy reads and writes, 2), the issue's "share of memcpy traffic".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from benchmarks.suite import MiB, Row, rate_stats, repeat_times, verdict
from powertrip.aggregation.fedavg import StreamingFedAvg, delta_sketch, sketch_stride
from powertrip.aggregation.fold_rows import shared_matrix
from powertrip.aggregation.robust import Aggregation
from powertrip.learning.device import host_rows, row_to_numpy, to_numpy
from powertrip.learning.models import build_model
from powertrip.services.common.tensor_stream import DEFAULT_CHUNK_BYTES

TARGET = 0.80
FOLD_TRAFFIC, COPY_TRAFFIC = 3, 2  # bytes moved per byte folded / copied


def memcpy_rate(src: dict[str, np.ndarray], repeats: int) -> float:
    """Median bytes/s of copying ``src`` (the baseline; its spread is not reported)."""
    dst = {k: np.empty_like(v) for k, v in src.items()}
    nbytes = sum(v.nbytes for v in src.values())

    def copy() -> None:
        for k, v in src.items():
            np.copyto(dst[k], v)

    copy()
    return rate_stats(nbytes, repeat_times(copy, repeats))[0]


def pieces(delta: dict[str, np.ndarray]) -> list[tuple[str, int, np.ndarray]]:
    step = DEFAULT_CHUNK_BYTES // 4
    out = []
    for name, a in delta.items():
        flat = a.reshape(-1)
        out += [(name, i, flat[i : i + step]) for i in range(0, flat.size, step)]
    return out


def streaming_rows(model_mib: int, repeats: int) -> list[Row]:
    n = model_mib * MiB // 4 // 4
    rng = np.random.default_rng(0)
    delta = {f"t{j}": rng.standard_normal(n, dtype=np.float32) for j in range(4)}
    template = {k: np.zeros_like(v) for k, v in delta.items()}
    nbytes = model_mib * MiB
    copy = memcpy_rate(delta, repeats)
    stride = sketch_stride(template)
    direction = delta_sketch(delta, template, stride)
    add = StreamingFedAvg(template)
    add_rate = rate_stats(nbytes, repeat_times(lambda: add.add(delta, 1.0), repeats))
    sliced = pieces(delta)
    agg = StreamingFedAvg(template, direction=direction)
    fold = lambda: agg.add_pieces(iter(sliced), 1.0)  # noqa: E731
    piece_rate = rate_stats(nbytes, repeat_times(fold, repeats))
    kib = DEFAULT_CHUNK_BYTES // 1024
    return [
        _row(f"fold StreamingFedAvg.add, {model_mib} MiB model", add_rate, copy),
        _row(f"fold add_pieces ({kib} KiB slices + sketch), {model_mib} MiB", piece_rate, copy),
    ]


def emulator_row(sites: int, repeats: int) -> Row:
    model = build_model("cnn1d", 10, (1, 40))
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    deltas = host_rows(params, sites)  # the trainer's round buffer: one [sites, P] matrix
    for d in deltas.values():
        d.copy_(torch.randn(d.shape, generator=gen))
    template = to_numpy(params)
    direction = delta_sketch(row_to_numpy(deltas, 0), template, sketch_stride(template))
    rule = Aggregation()

    weights = np.full(sites, 160.0)

    def round_aggregation() -> None:  # as Emulator._train_round folds a round
        agg = rule.make(template, direction=direction)
        half = rule.make(template)
        stacked = to_numpy(deltas)
        sq = agg.add_rows(stacked, weights)
        halves = {name: d[::2] for name, d in stacked.items()}
        half.add_rows(halves, weights[::2], None if sq is None else sq[::2])

    round_aggregation()
    model_bytes = sum(v.numel() * 4 for v in params.values())
    folded = model_bytes * (sites + (sites + 1) // 2)
    rate = rate_stats(folded, repeat_times(round_aggregation, repeats))
    stacked = to_numpy(deltas)  # the baseline: one copy of the same [sites, P] matrix
    copy = memcpy_rate({"rows": shared_matrix(stacked, list(stacked))}, repeats)
    kib = model_bytes / 1024
    return _row(f"fold emulator round aggregation, {sites} x {kib:.0f} KiB CNN1D", rate, copy)


def _row(name: str, rate: tuple[float, tuple[float, float]], copy: float) -> Row:
    """Ratio of memory traffic: folding an update byte reads it and reads and writes the
    accumulator (3 bytes moved), a memcpy reads and writes (2). ``rate``: ``rate_stats``."""
    mbs, base = rate[0] / MiB, copy / MiB
    traffic = FOLD_TRAFFIC * mbs / (COPY_TRAFFIC * base)
    return Row(
        name,
        mbs,
        "MiB/s",
        base,
        "memcpy (np.copyto)",
        traffic,
        f">= {TARGET:.0%} traffic",
        verdict(traffic >= TARGET),
        note=f"update bytes/s {mbs / base:.2f}x memcpy's",
        spread=(rate[1][0] / MiB, rate[1][1] / MiB),
    )


def run(quick: bool, ctx: dict[str, Any]) -> list[Row]:
    mib, sites, repeats = (8, 20, 3) if quick else (64, 100, 7)
    return [*streaming_rows(mib, repeats), emulator_row(sites, repeats)]
