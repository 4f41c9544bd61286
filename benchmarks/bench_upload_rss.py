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

Options the LLM upload benchmark (``bench_llm_upload.py``) drives: ``--shapes-file`` (a JSON
object of tensor name -> shape: a real model's shapes instead of ``--model-mib``), ``--bf16``
(the uploaders send float32 as bfloat16), ``--shards N`` (each site's update goes as N
concurrent shard streams, ``GrpcUploader.send_shards``) and ``--rows`` (each delta varies with
the row, ``delta_block``, so a shard folded at the wrong rows shows; the values are exact in
bfloat16).

    .venv/bin/python benchmarks/bench_upload_rss.py [--model-mib 256] [--uploads 8] [--no-naive]
"""

from __future__ import annotations

import argparse
import contextlib
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


def model_shapes(args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    """``--shapes-file``'s shapes, else ``--model-mib`` MiB in ``--tensors`` tensors."""
    if getattr(args, "shapes_file", None):
        raw = json.loads(Path(args.shapes_file).read_text())
        return {name: tuple(int(d) for d in shape) for name, shape in raw.items()}
    return shapes_for(args.model_mib, args.tensors)


ROW_STEPS = 8  # --rows: row r of site i's delta is delta_value(i) + (r % 8) / 8


def row_delta(site: int, rows: bool, lo: int, hi: int) -> np.ndarray:
    """The delta of rows [lo, hi) of site ``site``, one value per row (float64, exact)."""
    base = np.full(hi - lo, delta_value(site))
    return base + (np.arange(lo, hi) % ROW_STEPS) / ROW_STEPS if rows else base


def delta_block(site: int, shape: tuple[int, ...], rows: bool, row0: int = 0) -> np.ndarray:
    """Rows [row0, row0 + shape[0]) of site ``site``'s delta of a tensor (a 0-d tensor: the
    site's constant), as float32."""
    out = np.empty(shape, np.float32)
    if not shape:
        out.fill(delta_value(site))
        return out
    column = row_delta(site, rows, row0, row0 + shape[0]).astype(np.float32)
    out[...] = column.reshape((-1,) + (1,) * (len(shape) - 1))
    return out


def cpu_s() -> float:
    """User + system CPU seconds of this process so far (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


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

    def direct_sink(self, site: int, weight: float) -> None:
        return None  # every update is kept whole: nothing is folded as it arrives

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


def model_error(
    new: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]], uploads: int, rows: bool
) -> tuple[float, float]:
    """(largest |new - analytic FedAvg value| over every element, largest |analytic value|),
    one tensor at a time; the analytic value per row is computed in float64."""
    total = sum(weight(s) for s in range(uploads))
    err = top = 0.0
    for name, shape in shapes.items():
        n = shape[0] if shape else 1
        acc = sum(weight(s) * row_delta(s, rows and bool(shape), 0, n) for s in range(uploads))
        want = P0 + acc / total
        a = new[name].reshape(n, -1) if shape else new[name].reshape(1, 1)
        err = max(err, float(np.abs(a - want.astype(np.float32)[:, None]).max(initial=0.0)))
        top = max(top, float(np.abs(want).max()))
    return err, top


def serve(mode: str, args: argparse.Namespace) -> None:
    """Aggregator child: print {"port"}, wait for the uploads, commit, print the result."""
    from powertrip.aggregation.fedavg import delta_sketch, sketch_stride
    from powertrip.aggregation.robust import Aggregation
    from powertrip.services.aggregator.collector import RoundCollector
    from powertrip.services.aggregator.config import AggregatorConfig
    from powertrip.services.aggregator.registry import WorkerRegistry
    from powertrip.services.aggregator.service_handlers import add_to_server
    from powertrip.services.aggregator.servicer import AggregatorServicer
    from powertrip.services.common.config import ServiceConfig
    from powertrip.services.common.grpc_server import build_server
    from powertrip.services.common.memory import pin_mmap_threshold

    uploads, timeout_s, rows = args.uploads, args.timeout, args.rows
    pin_mmap_threshold()  # as services/aggregator/__main__.py does
    # The wire path alone: loopback, no TLS, the aggregator's transport window and receive
    # budget (BENCH_WINDOW_MIB / BENCH_BUDGET_MIB try others).
    fields = AggregatorConfig.model_fields
    window = int(os.environ.get("BENCH_WINDOW_MIB", fields["stream_window_mib"].default))
    budget = int(os.environ.get("BENCH_BUDGET_MIB", fields["receive_budget_mib"].default))
    cfg = ServiceConfig(insecure=True, stream_window_mib=window)
    registry = WorkerRegistry(num_sites=uploads)
    for s in range(uploads):
        registry.register(f"worker-{s}", f"127.0.0.1:{20000 + s}", [s])
    executor = SimpleNamespace(collector=None, params=None)
    # the fields the servicer reads: no allow-list, no site owners, no TLS
    unchecked = ("allowed_worker_ids", "allowed_workers_file", "site_owners", "site_owners_file")
    run_cfg = SimpleNamespace(
        **dict.fromkeys(unchecked),
        tls=False,
        stream_window_mib=cfg.stream_window_mib,
        receive_budget_mib=budget,
    )
    run = SimpleNamespace(registry=registry, executor=executor, cfg=run_cfg)
    servicer = AggregatorServicer(run)  # type: ignore[arg-type]  # only .registry/.executor used
    server, port, _ = build_server(
        [lambda srv: add_to_server(servicer, srv)],
        "127.0.0.1:0",
        cfg,
    )
    server.start()

    exact = reset_peak()
    rss_pre = status_kib("VmRSS")
    shapes = model_shapes(args)
    params = {n: np.full(shape, P0, dtype=np.float32) for n, shape in shapes.items()}
    # The default policy projects updates on the last global delta: the aggregator keeps its
    # strided sketch (at most fold_inputs.SKETCH_MAX coordinates), as GrpcRoundExecutor does.
    stride = sketch_stride(params)
    direction = {n: np.full(-(-a.size // stride), 1e-3, np.float32) for n, a in params.items()}
    rss_post = status_kib("VmRSS")
    selected = list(range(uploads))
    collector = (
        # FedAvg's streaming fold, measured here (in place as updates arrive, and checked
        # against the closed-form mean); the robust default spools each update instead
        RoundCollector(
            round=1,
            selected=selected,
            template=params,
            direction=direction,
            aggregation=Aggregation("fedavg"),
        )
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

    max_err, want = model_error(new, shapes, uploads, rows)
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
                "correct": max_err <= 1e-6 * want and accepted == uploads,
                "bit_exact": max_err == 0.0,
                "max_error": max_err,
            }
        ),
        flush=True,
    )


# --- uploader side ----------------------------------------------------------------------------


class LazyFull:
    """Array-like delta block (``delta_block``): shape and dtype for the stream header, data
    only when encoded; slicing rows (``shard_of``) stays lazy."""

    def __init__(self, site: int, shape: tuple[int, ...], rows: bool, row0: int = 0) -> None:
        self.site, self.shape, self.rows, self.row0 = site, shape, rows, row0
        self.dtype = np.dtype(np.float32)
        self.ndim = len(shape)

    def __getitem__(self, key: slice) -> LazyFull:
        lo, hi, _ = key.indices(self.shape[0])
        return LazyFull(self.site, (hi - lo, *self.shape[1:]), self.rows, self.row0 + lo)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = delta_block(self.site, self.shape, self.rows, self.row0)
        return a if dtype is None else a.astype(dtype, copy=False)


class LazyDelta(Mapping[str, LazyFull]):
    def __init__(self, shapes: Mapping[str, tuple[int, ...]], site: int, rows: bool) -> None:
        self._shapes = dict(shapes)
        self._site, self._rows = site, rows

    def __getitem__(self, name: str) -> LazyFull:
        return LazyFull(self._site, self._shapes[name], self._rows)

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)


def client(port: int, sites: list[int], args: argparse.Namespace) -> None:
    """Uploader child: one thread and one channel per site (its shards, with ``--shards``, as
    concurrent streams on that channel); starts on "go" from stdin."""
    import grpc

    from powertrip.services.common.config import ServiceConfig
    from powertrip.services.common.grpc_client import make_channel
    from powertrip.services.common.tensor_stream import DEFAULT_CHUNK_BYTES
    from powertrip.services.worker.sites_host import SiteUpdate
    from powertrip.services.worker.uploader import GrpcUploader, shard_updates

    timeout_s, prebuilt, rows = args.timeout, args.uploads == 1, args.rows

    chunk_bytes = int(os.environ.get("POWERTRIP_BENCH_CHUNK_BYTES", DEFAULT_CHUNK_BYTES))

    cfg = ServiceConfig(insecure=True)  # the wire path alone: loopback, no TLS
    shapes = model_shapes(args)
    channels = [make_channel(f"127.0.0.1:{port}", cfg) for _ in sites]
    for ch in channels:
        grpc.channel_ready_future(ch).result(timeout=30)
    results: dict[int, dict[str, Any]] = {}
    # One upload measures the rate: its delta exists before "go", as a worker's does. Several
    # measure memory: lazy constants keep the uploader processes small.
    deltas: dict[int, Mapping[str, Any]] = {
        s: {n: delta_block(s, shape, rows) for n, shape in shapes.items()}
        if prebuilt
        else LazyDelta(shapes, s, rows)
        for s in sites
    }

    def upload(site: int, channel: grpc.Channel) -> None:
        send = GrpcUploader(channel, f"worker-{site}", chunk_bytes, bf16=args.bf16)
        update = SiteUpdate(
            site=site,
            delta=deltas[site],  # type: ignore[arg-type]
            num_samples=weight(site),
            train_seconds=0.0,
        )
        t0 = time.time()
        try:
            if args.shards > 1:
                send.send_shards(1, shard_updates(update, args.shards), timeout_s)
            else:
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
    me += ["--timeout", str(args.timeout), "--shards", str(getattr(args, "shards", 1))]
    if getattr(args, "shapes_file", None):
        me += ["--shapes-file", str(args.shapes_file)]
    me += ["--bf16"] * bool(getattr(args, "bf16", False)) + ["--rows"] * bool(
        getattr(args, "rows", False)
    )
    procs: list[subprocess.Popen[str]] = []
    stack = contextlib.ExitStack()
    try:
        server = subprocess.Popen(me + ["--serve", mode], stdout=subprocess.PIPE, text=True)
        procs.append(server)
        port = json.loads(_line(server.stdout, "aggregator"))["port"]  # type: ignore[arg-type]
        rtt_ms = getattr(args, "rtt_ms", 0.0)
        if rtt_ms:  # the uploads cross a long link: the delay relay in front of the server
            from bench_stream_window import delay_relay

            port = stack.enter_context(delay_relay(port, rtt_ms / 2000))
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
        stack.close()
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
    ap.add_argument("--shapes-file", help="JSON tensor name -> shape (instead of --model-mib)")
    ap.add_argument("--bf16", action="store_true", help="send float32 as bfloat16")
    ap.add_argument("--shards", type=int, default=1, help="shard streams per site's update")
    ap.add_argument("--rows", action="store_true", help="deltas that vary with the row")
    ap.add_argument("--rtt-ms", type=float, default=0.0, help="added round trip (delay relay)")
    ap.add_argument("--serve", choices=["streaming", "naive"], help=argparse.SUPPRESS)
    ap.add_argument("--client", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--sites", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve, args)
        return 0
    if args.client is not None:
        sites = [int(s) for s in args.sites.split(",")]
        client(args.client, sites, args)
        return 0

    m, k = args.model_mib, args.uploads
    model = f"{m} MiB float32 update ({args.tensors} tensors)"
    if args.shapes_file:
        model = f"float32 update of the shapes in {args.shapes_file}"
    wire = (" as bfloat16" if args.bf16 else "") + (
        f" in {args.shards} shard streams" if args.shards > 1 else ""
    )
    print(
        f"{k} concurrent uploads of a {model}{wire} over loopback gRPC, 4 MiB message limit, "
        f"{args.client_procs} uploader processes"
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
        detail = "correct" if r["correct"] else f"WRONG: off by up to {r['max_error']:g}"
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
