"""CPU cost of one round's model broadcast: encoded once for every worker vs once per worker.

The aggregator sends every worker of a round the same model as a chunked tensor stream (header,
512 KiB chunks, XXH3-128 trailer). Encoding it per worker cuts, copies and hashes the whole model W
times a round; ``EncodedModel`` does it once and every worker's stream replays the messages.
This runs ``GrpcRoundExecutor.send_round`` for W workers at once (as a round does), with a
stand-in stub whose ``StartRound`` consumes the request iterator and serializes each message as
gRPC would, so only the network is left out. "before" is the per-worker encoding the executor
had (its old ``_round_stream``), "after" the executor as it is. Process CPU time (all threads).

    .venv/bin/python benchmarks/bench_broadcast.py [--mib 64] [--workers 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from powertrip.services.aggregator.delta_inbox import DeltaInbox  # noqa: E402
from powertrip.services.aggregator.executor import EncodedModel, GrpcRoundExecutor  # noqa: E402
from powertrip.services.common.tensor_stream import (  # noqa: E402
    DEFAULT_CHUNK_BYTES,
    encode,
    wrap_tensor_stream,
)
from powertrip.v1 import worker_pb2  # noqa: E402

SERIALIZE = True  # --no-serialize: iterate only, to see the encoding's share alone


class ConsumingStub:
    """What the executor sees of a worker: StartRound reads the whole stream, serialized."""

    def __init__(self) -> None:
        self.sent = 0

    def StartRound(self, requests: Iterator, timeout: float) -> None:  # noqa: N802 - gRPC name
        for msg in requests:
            self.sent += len(msg.SerializeToString()) if SERIALIZE else 1


class After(GrpcRoundExecutor):
    """The executor as it is; only the stub is replaced."""

    def _stub(self, worker_id: str) -> ConsumingStub:  # type: ignore[override]
        return ConsumingStub()


class Before(After):
    """The executor's former stream: the model encoded anew for every worker."""

    def _round_stream(
        self, spec: object, model: EncodedModel
    ) -> Iterator[worker_pb2.StartRoundRequest]:
        yield worker_pb2.StartRoundRequest(spec=spec)
        yield from wrap_tensor_stream(
            encode(model.params, DEFAULT_CHUNK_BYTES), worker_pb2.StartRoundRequest
        )


def broadcast_cpu_s(cls: type[After], params: dict[str, np.ndarray], workers: int) -> float:
    """CPU seconds (every thread of the process) to start one round on ``workers`` workers."""
    ex = cls(None, params, lambda p: (0.0, 0.0), 0, 60.0, False, None)  # type: ignore[arg-type]
    inbox = DeltaInbox(1, range(workers))
    spec = worker_pb2.StartRoundRequest().spec
    started = time.process_time()
    with ThreadPoolExecutor(workers) as pool:
        for w in range(workers):
            pool.submit(ex.send_round, inbox, f"w{w}", [w], spec, params)
    ex.release_broadcast()
    spent = time.process_time() - started
    ex.close()
    if inbox.failed:
        raise RuntimeError(f"broadcast failed: {inbox.failed}")
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="model size")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="best of")
    ap.add_argument("--no-serialize", action="store_true", help="leave out gRPC's serializing")
    a = ap.parse_args()
    global SERIALIZE
    SERIALIZE = not a.no_serialize
    rng = np.random.default_rng(0)
    n = a.mib * (1 << 20) // 4
    params = {  # a few tensors, as a model has, one of them odd-sized across chunk borders
        "embed": rng.standard_normal(n // 2).astype(np.float32),
        "block": rng.standard_normal(n // 2 - 1001).astype(np.float32),
        "head": rng.standard_normal(1001).astype(np.float32),
    }
    before = min(broadcast_cpu_s(Before, params, a.workers) for _ in range(a.repeats))
    after = min(broadcast_cpu_s(After, params, a.workers) for _ in range(a.repeats))
    what = "serialized per worker" if SERIALIZE else "not serialized"
    print(f"broadcast of a {a.mib} MiB model to {a.workers} workers, {what} (best of {a.repeats})")
    print(f"{'':28}{'CPU s':>8}")
    print(f"{'before (encode per worker)':28}{before:8.3f}")
    print(f"{'after (encode once)':28}{after:8.3f}")
    print(f"before / after: {before / after:.2f}x")


if __name__ == "__main__":
    main()
