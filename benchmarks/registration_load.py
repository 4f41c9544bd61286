"""Registration load: N new workers registering with one aggregator at the same moment, over
mutual TLS, each with its own certificate.

A real profiler and a real aggregator run as child processes (``powertrip-profiler``,
``powertrip-aggregator``) with certificates from ``mint_cluster`` for ids ``w000``..``wNNN`` and
an allow-list of exactly those ids. The run has one site more than there are clients, so it
keeps waiting for sites and nothing trains while the clients register. Each client is a thread
with its own channel (its own certificate, ``grpc.use_local_subchannel_pool``: its own TCP and
TLS connection); all wait on one barrier, then call ``RegisterWorker`` once for their own site.
A client's latency is that first call on a fresh channel: connection, TLS handshake and the RPC,
which is what a new worker waits for. Peak aggregator RSS is its ``VmHWM`` at the end.

Targets (the reliability matrix, R24): 200 clients: every registration succeeds, p99 <= 0.5 s;
500 clients: no crash, and p99 <= 1.5 s (RESOURCE_EXHAUSTED is an acceptable answer there, to be
retried by the worker with jitter).

    .venv/bin/python benchmarks/registration_load.py [--clients 200,500] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from powertrip.sites import site_id  # noqa: E402
from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc  # noqa: E402
from services.cli.certs import mint_cluster, tls_env  # noqa: E402
from services.cli.service_process import Service, start_service  # noqa: E402
from services.common.config import ServiceConfig, load_config  # noqa: E402
from services.common.grpc_options import client_options  # noqa: E402
from services.common.tls import channel_credentials  # noqa: E402

#: the matrix's targets: clients -> (required success ratio, p99 seconds)
TARGETS = {200: (1.0, 0.5), 500: (0.0, 1.5)}


def worker_ids(n: int) -> list[str]:
    return [f"w{i:03d}" for i in range(n)]


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil
    return ordered[int(rank) - 1]


@dataclass
class LoadResult:
    clients: int
    ok: int
    codes: dict[str, int]  # status code name -> count, OK included
    latencies_s: list[float] = field(repr=False)
    rss_before_mib: float = 0.0
    peak_rss_mib: float = 0.0
    alive: bool = True
    server_mean_s: float = float("nan")  # RegisterWorker's mean time in the server's handler

    @property
    def p50(self) -> float:
        return percentile(self.latencies_s, 50)

    @property
    def p95(self) -> float:
        return percentile(self.latencies_s, 95)

    @property
    def p99(self) -> float:
        return percentile(self.latencies_s, 99)

    def summary(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "latencies_s"}
        return out | {"p50_s": self.p50, "p95_s": self.p95, "p99_s": self.p99}


def server_mean_s(metrics_url: str, method: str = "RegisterWorker") -> float:
    """Mean of ``grpc_server_handling_seconds`` for ``method`` (every call, the flood's too)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    total = {"_sum": 0.0, "_count": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            suffix = sample.name.removeprefix("grpc_server_handling_seconds")
            if suffix in total and sample.labels.get("grpc_method") == method:
                total[suffix] += sample.value
    return total["_sum"] / total["_count"] if total["_count"] else float("nan")


class Aggregator:
    """A profiler and an aggregator over mTLS for ``clients`` worker ids (certificates minted
    into ``workdir/tls``); the run has ``clients + 1`` sites, so it only ever registers."""

    def __init__(self, workdir: Path, clients: int) -> None:
        self.workdir, self.clients = workdir, clients
        self.tls_dir = workdir / "tls"
        self.ids = worker_ids(clients)
        self.services: list[Service] = []

    def _env(self, name: str, **values: object) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("POWERTRIP_")}
        base = {"BIND_HOST": "127.0.0.1", "GRPC_PORT": 0, "METRICS_PORT": 0}
        for key, value in {**base, "NUM_SITES": self.clients + 1, **values}.items():
            env[f"POWERTRIP_{key.upper()}"] = str(value)
        return env | tls_env(self.tls_dir, name)

    def _start(self, name: str, env: dict[str, str]) -> Service:
        service = start_service(name, name, env, self.workdir / "logs")
        self.services.append(service)
        service.wait_ready(120)
        return service

    def __enter__(self) -> Aggregator:
        mint_cluster(self.tls_dir, self.ids)
        prof = self._start("profiler", self._env("profiler"))
        self.service = self._start(
            "aggregator",
            self._env(
                "aggregator",
                profiler_addr=prof.grpc_addr,
                preset="quick",
                num_samples=max(10_000, 20 * (self.clients + 1)),
                checkpoint_dir="",
                allowed_workers=",".join(self.ids),
                registration_timeout_s=3600,
            ),
        )
        return self

    def __exit__(self, *exc: object) -> None:
        for s in self.services:
            if s.process.poll() is None:
                s.process.kill()
            s.process.wait()

    @property
    def pid(self) -> int:
        return self.service.process.pid

    def channel(self, name: str) -> grpc.Channel:
        """A channel of its own (own connection) presenting ``name``'s certificate."""
        cfg = load_config(ServiceConfig, tls_env(self.tls_dir, name))
        creds = channel_credentials(cfg)
        assert creds is not None
        options = [*client_options(cfg), ("grpc.use_local_subchannel_pool", 1)]
        return grpc.secure_channel(self.service.grpc_addr, creds, options=options)


def register_all(agg: Aggregator, timeout_s: float = 30.0, preconnect: bool = False) -> LoadResult:
    """Every id registers its own site at once (one thread and one channel each). With
    ``preconnect`` every channel finishes its TLS handshake first, so the latency is the RPC
    alone (what the handshakes cost is the difference)."""
    ids = agg.ids
    channels = [agg.channel(w) for w in ids]
    if preconnect:
        for ch in channels:
            grpc.channel_ready_future(ch).result(timeout=timeout_s)
    barrier = threading.Barrier(len(ids) + 1)
    results: list[tuple[str, float]] = [("", 0.0)] * len(ids)

    def client(i: int) -> None:
        stub = aggregator_pb2_grpc.AggregatorServiceStub(channels[i])
        request = aggregator_pb2.RegisterWorkerRequest(
            worker_id=ids[i],
            address=f"127.0.0.1:{20_000 + i}",
            site_ids=[site_id(i)],
            ready=True,  # its sites loaded: counted as registered
        )
        barrier.wait()
        t0 = time.perf_counter()
        try:
            stub.RegisterWorker(request, timeout=timeout_s)
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
        results[i] = (code, time.perf_counter() - t0)

    rss_before = status_kib(agg.pid, "VmRSS") / 1024
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(ids))]
    for t in threads:
        t.start()
    barrier.wait()
    for t in threads:
        t.join(timeout_s + 10)
    for ch in channels:
        ch.close()
    alive = agg.service.process.poll() is None
    codes = Counter(code for code, _ in results)
    return LoadResult(
        clients=len(ids),
        ok=codes.get("OK", 0),
        codes=dict(codes),
        latencies_s=[lat for code, lat in results if code == "OK"],
        rss_before_mib=rss_before,
        peak_rss_mib=status_kib(agg.pid, "VmHWM") / 1024 if alive else float("nan"),
        alive=alive,
        server_mean_s=server_mean_s(agg.service.metrics_url) if alive else float("nan"),
    )


def verdict(r: LoadResult) -> str:
    need_ok, p99_s = TARGETS.get(r.clients, (1.0, 1.5))
    answered = r.ok + r.codes.get("RESOURCE_EXHAUSTED", 0)
    good = r.alive and r.ok >= need_ok * r.clients and answered == r.clients and r.p99 <= p99_s
    return "PASS" if good else "MISS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="200,500", help="comma-separated client counts")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--preconnect", action="store_true", help="handshake first: time the RPC alone")
    a = ap.parse_args()
    rows = []
    print(
        f"{'clients':>7} {'ok':>5} {'exhausted':>9} {'other':>5} {'p50 ms':>7} {'p95 ms':>7} "
        f"{'p99 ms':>7} {'srv ms':>6} {'RSS0 MiB':>8} {'peak MiB':>8} {'alive':>5}  target"
    )
    for n in (int(x) for x in a.clients.split(",")):
        with tempfile.TemporaryDirectory() as tmp, Aggregator(Path(tmp), n) as agg:
            r = register_all(agg, preconnect=a.preconnect)
        exhausted = r.codes.get("RESOURCE_EXHAUSTED", 0)
        other = r.clients - r.ok - exhausted
        print(
            f"{n:>7} {r.ok:>5} {exhausted:>9} {other:>5} {r.p50 * 1e3:>7.0f} {r.p95 * 1e3:>7.0f} "
            f"{r.p99 * 1e3:>7.0f} {r.server_mean_s * 1e3:>6.1f} {r.rss_before_mib:>8.0f} "
            f"{r.peak_rss_mib:>8.0f} {str(r.alive):>5}  {verdict(r)}",
            flush=True,
        )
        rows.append(r.summary() | {"verdict": verdict(r), "preconnect": a.preconnect})
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
