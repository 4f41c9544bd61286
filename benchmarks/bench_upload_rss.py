"""Aggregator peak RSS while K large updates stream in over gRPC at the 4 MiB message limit.

The aggregator side is a child process running a real gRPC server (``build_server`` with the
``ServiceConfig`` defaults, so a 4 MiB per-message limit) that serves the real
``AggregatorServicer``. Instead of an ``AggregatorRun`` (the aggregator's ``Run``, which loads a
dataset) it gets a stand-in
exposing only what ``SubmitUpdate`` reads: a real ``WorkerRegistry`` with site i hosted by
worker i, and an executor whose ``collector`` is a real ``RoundCollector`` over a float32 global
model of ``--model-mib`` MiB. The uploaders are separate client processes (``--client-procs``
of them, the uploads split across their threads, one channel each) that send a ``SiteUpdate``
through the worker's own ``GrpcUploader`` (``update_wire``). With several uploads each delta
is a constant built one tensor at a time while it is encoded, so a client never holds a whole
update; a lone upload (the rate run, ``--uploads 1``) has its delta built before "go", as a real
worker holds its delta in memory when it sends it.

Peak RSS of the aggregator process is VmHWM, reset through ``/proc/self/clear_refs`` once the
global model is allocated. It is reported against the RSS before the model existed, with the
server already listening (the figure the target is about: the model itself, the FedAvg
accumulator and everything the uploads cost), and against the RSS just after the model was
allocated. When every update is in, the round is
closed and committed as the executor does (``collector.close()``, then
``collector.agg.apply(params, in_place=True)``), and the new model is checked against the
analytic FedAvg value. The naive baseline runs the same server and the same uploads, with a
collector that keeps each verified update as arrays (``TensorStreamReceiver.arrays()``) until
the round ends and then averages them.

The exit status is non-zero only when an upload fails or the new model is wrong; a MISS of the
2.5x target is a reported figure. Children inherit the environment, so allocator settings
(e.g. ``MALLOC_MMAP_THRESHOLD_``) can be tried without touching the code; the header shows any
``MALLOC_*`` variable that is set. ``POWERTRIP_BENCH_CHUNK_BYTES`` sets the uploaders' chunk
size. Besides memory it reports how long the last fold took after its stream ended and the CPU
seconds of the aggregator and the uploaders over the uploads.

    .venv/bin/python benchmarks/bench_upload_rss.py [--model-mib 256] [--uploads 8] [--no-naive]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memprobe import kib, reset_peak, status_kib  # noqa: E402  (benchmarks/ is on the path)

MiB = 1 << 20
TARGET_X = 2.5  # the target: aggregator peak RSS < 2.5x the model size
P0 = 1.0  # every element of the global model before the round


def delta_value(site: int) -> float:
    """Site i's update is the constant 0.25 * (i + 1) (exact in float32)."""
    return 0.25 * (site + 1)


def weight(site: int) -> float:
    """Site i reports i + 1 samples, so FedAvg is a weighted, not a plain, mean."""
    return float(site + 1)


def shapes_for(model_mib: int, tensors: int) -> dict[str, tuple[int, ...]]:
    n = model_mib * MiB // 4 // tensors
    return {f"layer{j}.weight": (n // 1024, 1024) for j in range(tensors)}


def cpu_s() -> float:
    """User + system CPU seconds of this process so far (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def expected_value(uploads: int) -> float:
    total = sum(weight(s) for s in range(uploads))
    return P0 + sum(weight(s) * delta_value(s) for s in range(uploads)) / total


# --- aggregator side --------------------------------------------------------------------------


class NaiveCollector:
    """The baseline: the RoundCollector interface, but every verified update is kept as arrays
    until the round ends, then averaged in one go."""

    def __init__(self, selected: Sequence[int]) -> None:
        self.selected = [int(s) for s in selected]
        self.kept: dict[int, tuple[dict[str, np.ndarray], float]] = {}
        self.failed: dict[int, str] = {}
        self._cv = threading.Condition()

    def admit(self, site: int, round_index: int) -> None:
        pass

    def weight_problem(self, site: int, weight: float) -> str | None:
        return None  # the benchmark's uploads are honest

    def commit(self, site: int, rx: Any, weight: float) -> None:
        arrays = rx.arrays()
        rx.close()
        with self._cv:
            self.kept[site] = (arrays, weight)
            self._cv.notify_all()

    def fail(self, site: int, reason: str) -> None:
        with self._cv:
            self.failed[site] = reason
            self._cv.notify_all()

    def wait(self, timeout_s: float) -> bool:
        with self._cv:
            return self._cv.wait_for(
                lambda: len(self.kept) + len(self.failed) >= len(self.selected), timeout_s
            )

    def close(self) -> None:
        pass

    def apply(self, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        total = sum(w for _, w in self.kept.values())
        ordered = [self.kept[s] for s in self.selected if s in self.kept]
        return {
            name: p + sum(w * u[name] for u, w in ordered) / np.float32(total)
            for name, p in params.items()
        }


def serve(mode: str, model_mib: int, tensors: int, uploads: int, timeout_s: float) -> None:
    """Aggregator child: print {"port"}, wait for the uploads, commit, print the result."""
    from powertrip.fedavg import delta_sketch, sketch_stride
    from powertrip.v1 import aggregator_pb2_grpc
    from services.aggregator.collector import RoundCollector
    from services.aggregator.registry import WorkerRegistry
    from services.aggregator.servicer import AggregatorServicer
    from services.common.config import ServiceConfig
    from services.common.grpc_server import build_server
    from services.common.memory import pin_mmap_threshold

    pin_mmap_threshold()  # as services/aggregator/__main__.py does
    cfg = ServiceConfig(insecure=True)  # the wire path alone: loopback, no TLS
    registry = WorkerRegistry(num_sites=uploads)
    for s in range(uploads):
        registry.register(f"worker-{s}", f"127.0.0.1:{20000 + s}", [s])
    executor = SimpleNamespace(collector=None, params=None)
    run_cfg = SimpleNamespace(allowed_worker_ids=None)  # the field the servicer reads
    run = SimpleNamespace(registry=registry, executor=executor, cfg=run_cfg)
    servicer = AggregatorServicer(run)  # type: ignore[arg-type]  # only .registry/.executor used
    server, port, _ = build_server(
        [lambda srv: aggregator_pb2_grpc.add_AggregatorServiceServicer_to_server(servicer, srv)],
        "127.0.0.1:0",
        cfg,
    )
    server.start()

    exact = reset_peak()
    rss_pre = status_kib("VmRSS")
    params = {
        n: np.full(shape, P0, dtype=np.float32)
        for n, shape in shapes_for(model_mib, tensors).items()
    }
    # The default policy projects updates on the last global delta: the aggregator keeps its
    # strided sketch (at most fold_inputs.SKETCH_MAX coordinates), as GrpcRoundExecutor does.
    stride = sketch_stride(params)
    direction = {n: np.full(-(-a.size // stride), 1e-3, np.float32) for n, a in params.items()}
    rss_post = status_kib("VmRSS")
    selected = list(range(uploads))
    collector = (
        RoundCollector(round=1, selected=selected, template=params, direction=direction)
        if mode == "streaming"
        else NaiveCollector(selected)
    )
    executor.params = params
    executor.collector = collector
    # When each verified stream was handed over and when its commit (the fold, in order)
    # returned: splits an upload's time into the stream and the fold after it.
    folds: list[tuple[float, float]] = []
    commit = collector.commit

    def timed_commit(site: int, rx: Any, weight: float) -> None:
        t0 = time.time()
        commit(site, rx, weight)
        folds.append((t0, time.time()))

    collector.commit = timed_commit  # type: ignore[method-assign]
    reset_peak()
    cpu0 = cpu_s()
    print(json.dumps({"port": port}), flush=True)

    complete = collector.wait(timeout_s)
    t_commit = time.time()
    collector.close()
    if mode == "streaming":
        previous = params
        new = collector.agg.apply(params, in_place=True)
        direction = delta_sketch(new, previous, stride)  # the next round's direction
        accepted, failed = len(collector.accepted), dict(collector.failed)
    else:
        new = collector.apply(params)
        accepted, failed = len(collector.kept), dict(collector.failed)
    peak = kib("VmHWM", exact)
    cpu = cpu_s() - cpu0
    t_done = time.time()
    server.stop(None)

    want = expected_value(uploads)
    values = {float(a.flat[0]) for a in new.values()}
    uniform = all(bool((a == a.flat[0]).all()) for a in new.values())
    max_err = max(abs(v - want) for v in values)
    print(
        json.dumps(
            {
                "exact": exact,
                "complete": complete,
                "accepted": accepted,
                "failed": failed,
                "rss_pre_mib": rss_pre / 1024,
                "rss_post_mib": rss_post / 1024,
                "peak_mib": peak / 1024,
                "cpu_s": cpu,
                "model_mib": sum(a.nbytes for a in params.values()) / MiB,
                "commit_s": t_done - t_commit,
                "t_done": t_done,
                "commits": folds,
                "correct": uniform and max_err <= 1e-6 * abs(want) and accepted == uploads,
                "value": sorted(values),
                "expected": want,
            }
        ),
        flush=True,
    )


# --- uploader side ----------------------------------------------------------------------------


class LazyFull:
    """Array-like constant: shape and dtype for the stream header, data only when encoded."""

    def __init__(self, shape: tuple[int, ...], value: float) -> None:
        self.shape = shape
        self.dtype = np.dtype(np.float32)
        self.value = value

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.full(self.shape, self.value, dtype=dtype or self.dtype)


class LazyDelta(Mapping[str, LazyFull]):
    def __init__(self, shapes: Mapping[str, tuple[int, ...]], value: float) -> None:
        self._shapes = dict(shapes)
        self._value = value

    def __getitem__(self, name: str) -> LazyFull:
        return LazyFull(self._shapes[name], self._value)

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)


def client(
    port: int, sites: list[int], model_mib: int, tensors: int, timeout_s: float, prebuilt: bool
) -> None:
    """Uploader child: one thread and one channel per site; starts on "go" from stdin."""
    import grpc

    from services.common.config import ServiceConfig
    from services.common.grpc_client import make_channel
    from services.common.tensor_stream import DEFAULT_CHUNK_BYTES
    from services.worker.sites_host import SiteUpdate
    from services.worker.uploader import GrpcUploader

    chunk_bytes = int(os.environ.get("POWERTRIP_BENCH_CHUNK_BYTES", DEFAULT_CHUNK_BYTES))

    cfg = ServiceConfig(insecure=True)  # the wire path alone: loopback, no TLS
    shapes = shapes_for(model_mib, tensors)
    channels = [make_channel(f"127.0.0.1:{port}", cfg) for _ in sites]
    for ch in channels:
        grpc.channel_ready_future(ch).result(timeout=30)
    results: dict[int, dict[str, Any]] = {}
    # One upload measures the rate: its delta exists before "go", as a worker's does. Several
    # measure memory: lazy constants keep the uploader processes small.
    deltas: dict[int, Mapping[str, Any]] = {
        s: {n: np.full(shape, delta_value(s), np.float32) for n, shape in shapes.items()}
        if prebuilt
        else LazyDelta(shapes, delta_value(s))
        for s in sites
    }

    def upload(site: int, channel: grpc.Channel) -> None:
        send = GrpcUploader(channel, f"worker-{site}", chunk_bytes)
        update = SiteUpdate(
            site=site,
            delta=deltas[site],  # type: ignore[arg-type]
            num_samples=weight(site),
            train_seconds=0.0,
        )
        t0 = time.time()
        try:
            send(1, update, timeout_s)
            results[site] = {"start": t0, "end": time.time(), "error": None}
        except grpc.RpcError as exc:
            err = f"{exc.code().name}: {exc.details()}"
            results[site] = {"start": t0, "end": time.time(), "error": err}

    print("ready", flush=True)
    sys.stdin.readline()
    cpu0 = cpu_s()
    threads = [
        threading.Thread(target=upload, args=(s, ch)) for s, ch in zip(sites, channels, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ch in channels:
        ch.close()
    cpu = cpu_s() - cpu0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"uploads": results, "peak_rss_mib": rss_mib, "cpu_s": cpu}), flush=True)


# --- orchestration ----------------------------------------------------------------------------


def _line(stream: IO[str], what: str) -> str:
    line = stream.readline()
    if not line:
        raise RuntimeError(f"{what} exited before answering (see its stderr above)")
    return line


def run_round(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One aggregator child and its client children; returns the aggregator's figures."""
    me = [sys.executable, __file__, "--model-mib", str(args.model_mib)]
    me += ["--tensors", str(args.tensors), "--uploads", str(args.uploads)]
    me += ["--timeout", str(args.timeout)]
    procs: list[subprocess.Popen[str]] = []
    try:
        server = subprocess.Popen(me + ["--serve", mode], stdout=subprocess.PIPE, text=True)
        procs.append(server)
        port = json.loads(_line(server.stdout, "aggregator"))["port"]  # type: ignore[arg-type]
        groups = [
            list(range(args.uploads))[i :: args.client_procs] for i in range(args.client_procs)
        ]
        clients = []
        for g in (g for g in groups if g):
            cmd = me + ["--client", str(port), "--sites", ",".join(map(str, g))]
            p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs.append(p)
            clients.append(p)
        for p in clients:
            _line(p.stdout, "uploader")  # type: ignore[arg-type]  # "ready"
        t_go = time.time()
        for p in clients:
            p.stdin.write("go\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        reports = [json.loads(_line(p.stdout, "uploader")) for p in clients]  # type: ignore[arg-type]
        result = json.loads(_line(server.stdout, "aggregator"))  # type: ignore[arg-type]
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    uploads = {int(s): u for r in reports for s, u in r["uploads"].items()}
    result["errors"] = {s: u["error"] for s, u in uploads.items() if u["error"]}
    result["upload_s"] = max(u["end"] for u in uploads.values()) - t_go
    result["wall_s"] = result["t_done"] - t_go
    # the last stream's end to the last commit's return: the fold an upload waits for
    result["fold_s"] = max(e for _, e in result["commits"]) - max(s for s, _ in result["commits"])
    result["client_peak_mib"] = max(r["peak_rss_mib"] for r in reports)
    # CPU seconds over the uploads (less sensitive to a shared machine than wall time)
    result["client_cpu_s"] = sum(r["cpu_s"] for r in reports)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-mib", type=int, default=256, help="float32 model size in MiB")
    ap.add_argument("--uploads", type=int, default=8, help="concurrent uploads (sites)")
    ap.add_argument("--tensors", type=int, default=4, help="tensors the model is split into")
    ap.add_argument("--client-procs", type=int, default=2, help="uploader processes")
    ap.add_argument(
        "--naive",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the keep-every-update baseline (default: yes)",
    )
    ap.add_argument("--timeout", type=float, default=900.0, help="per-upload deadline, seconds")
    ap.add_argument("--serve", choices=["streaming", "naive"], help=argparse.SUPPRESS)
    ap.add_argument("--client", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--sites", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve, args.model_mib, args.tensors, args.uploads, args.timeout)
        return 0
    if args.client is not None:
        sites = [int(s) for s in args.sites.split(",")]
        client(args.client, sites, args.model_mib, args.tensors, args.timeout, args.uploads == 1)
        return 0

    m, k = args.model_mib, args.uploads
    print(
        f"{k} concurrent uploads of a {m} MiB float32 update ({args.tensors} tensors) over "
        f"loopback gRPC, 4 MiB message limit, {args.client_procs} uploader processes"
    )
    malloc_env = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    if malloc_env:
        print(f"allocator environment: {malloc_env}")
    modes = ["streaming", "naive"] if args.naive else ["streaming"]
    results = {mode: run_round(mode, args) for mode in modes}

    head = ("method", "model MiB", "uploads", "peak MiB", "x model", "x post", "wall s", "target")
    print("{:<10} {:>9} {:>7} {:>9} {:>8} {:>7} {:>7}  {}".format(*head))
    ok = True
    for mode, r in results.items():
        growth = r["peak_mib"] - r["rss_pre_mib"]
        x = growth / r["model_mib"]
        x_post = (r["peak_mib"] - r["rss_post_mib"]) / r["model_mib"]
        verdict = "PASS" if x < TARGET_X else "MISS"
        print(
            f"{mode:<10} {r['model_mib']:>9.0f} {k:>7} {growth:>9.1f} {x:>7.2f}x {x_post:>6.2f}x "
            f"{r['wall_s']:>7.1f}  {verdict} (< {TARGET_X}x)"
        )
        good = r["correct"] and not r["errors"] and r["complete"]
        ok = ok and good
        detail = "correct" if r["correct"] else f"WRONG: {r['value']} vs {r['expected']}"
        print(
            f"{'':<11}uploads done in {r['upload_s']:.1f} s (last fold {r['fold_s']:.2f} s), "
            f"commit {r['commit_s']:.2f} s, CPU {r['cpu_s']:.1f} s aggregator / "
            f"{r['client_cpu_s']:.1f} s uploaders; "
            f"RSS before model {r['rss_pre_mib']:.0f} MiB, after {r['rss_post_mib']:.0f} MiB, "
            f"peak {r['peak_mib']:.0f} MiB; uploader peak {r['client_peak_mib']:.0f} MiB; "
            f"model {detail} ({r['accepted']}/{k} folded)"
        )
        if r["errors"] or r["failed"]:
            print(f"{'':<11}errors: {r['errors']} failed: {r['failed']}")
    if "naive" in results:
        s, v = results["streaming"], results["naive"]
        ratio = (v["peak_mib"] - v["rss_pre_mib"]) / (s["peak_mib"] - s["rss_pre_mib"])
        print(f"naive / streaming peak growth: {ratio:.2f}x")
    print(
        "x model = (peak RSS - RSS before the model) / model; x post = (peak RSS - RSS with the "
        "model allocated) / model"
    )
    if not all(r["exact"] for r in results.values()):
        print("note: /proc/self/clear_refs not writable; used ru_maxrss (may under-report)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
