"""What the aggregator does per update byte on the real path, against memcpy: a 64 MiB update's
request bytes as the worker sends them, read (``chunk_wire``), checked (offsets, finite values,
XXH3 checksum: ``TensorStreamReceiver``) and folded, for an update whose turn it is (folded as
its chunks arrive, with the undo log: ``fold_in_place``) and for one ahead of its turn (spooled,
then replayed into the fold). No gRPC: the bytes are already in memory, so the rate is the
aggregator's own work per byte, a ceiling on one upload's rate whatever the transport.
"""

from __future__ import annotations

import tempfile
from typing import Any, BinaryIO

import numpy as np

from benchmarks.suite import MiB, Row, rate_stats, repeat_times
from benchmarks.suite.fold import _row, memcpy_rate
from powertrip.aggregation.fedavg import StreamingFedAvg, delta_sketch, sketch_stride
from powertrip.aggregation.fold_in_place import InPlaceFold
from powertrip.services.common.chunk_wire import read_submit_request
from powertrip.services.common.tensor_receiver import TensorStreamReceiver
from powertrip.services.common.tensor_stream import DEFAULT_CHUNK_BYTES, TensorSpec, specs_of
from powertrip.services.worker.uploader import tensor_wire


def intake(
    wire: list[bytes], specs: list[TensorSpec], agg: StreamingFedAvg, undo: BinaryIO | None
) -> None:
    """One update's requests through the receiver into ``agg``: straight in with ``undo`` as
    its undo log (the round's, reused as the aggregator does), or spooled first (None)."""
    folds: list[InPlaceFold] = []

    def sink_for() -> Any:
        folds.append(InPlaceFold([agg], 1.0, undo))
        return folds[-1].add

    with TensorStreamReceiver(specs, sink_for=None if undo is None else sink_for) as rx:
        for data in wire:
            msg = read_submit_request(data)
            part = msg.WhichOneof("part")
            getattr(rx, part)(getattr(msg, part))
        if folds:
            folds[0].commit()
        else:
            agg.add_pieces(rx.pieces(), 1.0)


def run(quick: bool, ctx: dict[str, Any]) -> list[Row]:
    mib, repeats = (8, 3) if quick else (64, 7)
    n = mib * MiB // 4 // 4
    rng = np.random.default_rng(0)
    delta = {f"t{j}": rng.standard_normal(n, dtype=np.float32) for j in range(4)}
    template = {k: np.zeros_like(v) for k, v in delta.items()}
    wire, specs = list(tensor_wire(delta, DEFAULT_CHUNK_BYTES)), specs_of(delta)
    copy = memcpy_rate(delta, repeats)
    direction = delta_sketch(delta, template, sketch_stride(template))
    rows = []
    undo = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    for label, log in (("in turn (folded as it arrives)", undo), ("ahead of its turn", None)):
        agg = StreamingFedAvg(template, direction=direction)
        intake(wire, specs, agg, log)  # warm-up, and the accumulator's pages
        times = repeat_times(lambda: intake(wire, specs, agg, log), repeats)  # noqa: B023
        rows.append(
            _row(f"aggregator intake, {mib} MiB update {label}", rate_stats(mib * MiB, times), copy)
        )
    undo.close()
    return rows
