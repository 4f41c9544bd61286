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
retried by the worker with jitter). With ``--retry`` each client retries as a worker does
(``retry_idempotent``) and must get in, p99 (to its final answer) <= 1.5 s. ``--baseline``
runs the client options before issue 20 (a 2 s connect timeout) interleaved with the current
ones and prints current/baseline p99 ratios; ``--busy N`` adds N spinning processes (a shared
machine); every case runs ``--repeats`` times, summarised as min/median/max.

    .venv/bin/python benchmarks/registration_load.py [--clients 200,500] [--retry] [--baseline]
        [--busy 2] [--repeats 3] [--max-concurrent-rpcs 256] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load_stats import (  # noqa: E402
    busy_cores,
    failure_kind,
    percentile,
    server_mean_s,
    spread,
    status_kib,
)
from powertrip.services.cli.certs import mint_cluster, tls_env  # noqa: E402
from powertrip.services.cli.service_process import Service, start_service  # noqa: E402
from powertrip.services.common.config import ServiceConfig, load_config  # noqa: E402
from powertrip.services.common.grpc_client import retry_idempotent  # noqa: E402
from powertrip.services.common.grpc_options import client_options  # noqa: E402
from powertrip.services.common.tls import channel_credentials  # noqa: E402
from powertrip.sites.profiles import site_id  # noqa: E402
from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc  # noqa: E402

#: the matrix's targets: clients -> (required success ratio, p99 seconds)
TARGETS = {200: (1.0, 0.5), 500: (0.0, 1.5)}
#: how long a worker keeps retrying its registration (WorkerConfig.register_timeout_s' default)
WORKER_RETRY_S = 120.0
Options = Sequence[tuple[str, int | str]]
#: the client options before issue 20 (a 2 s connect deadline), for --baseline
BASELINE_OPTIONS: Options = (("grpc.min_reconnect_backoff_ms", 2000),)


def worker_ids(n: int) -> list[str]:
    return [f"w{i:03d}" for i in range(n)]


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
    retry: bool = False  # each client retried as a worker does
    attempts: int = 0  # RegisterWorker calls, retries included
    failures: dict[str, int] = field(default_factory=dict)  # failed attempts by code and cause

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


class Aggregator:
    """A profiler and an aggregator over mTLS for ``clients`` worker ids (certificates minted
    into ``workdir/tls``); the run has ``clients + 1`` sites, so it only ever registers."""

    def __init__(self, workdir: Path, clients: int, **env: object) -> None:
        self.workdir, self.clients, self.extra_env = workdir, clients, env
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
                **self.extra_env,
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

    def channel(self, name: str, overrides: Options = ()) -> grpc.Channel:
        """A channel of its own (own connection) presenting ``name``'s certificate; ``overrides``
        replace client options of the same name."""
        cfg = load_config(ServiceConfig, tls_env(self.tls_dir, name))
        creds = channel_credentials(cfg)
        assert creds is not None
        replaced = {key for key, _ in overrides}
        options = [o for o in client_options(cfg) if o[0] not in replaced]
        # the identity the aggregator proves, whatever address it is dialled at
        options += [*overrides, ("grpc.use_local_subchannel_pool", 1)]
        options.append(("grpc.ssl_target_name_override", "aggregator"))
        return grpc.secure_channel(self.service.grpc_addr, creds, options=options)


def register_all(
    agg: Aggregator,
    timeout_s: float = 30.0,
    preconnect: bool = False,
    retry: bool = False,
    overrides: Options = (),
) -> LoadResult:
    """Every id registers its own site at once (one thread and one channel each). With
    ``preconnect`` every channel finishes its TLS handshake first, so the latency is the RPC
    alone (what the handshakes cost is the difference). With ``retry`` each client retries as a
    worker does (``retry_idempotent`` with the worker's budget, ``timeout_s`` per attempt) and
    its latency runs to its final answer. ``overrides`` replace client options (a baseline)."""
    ids = agg.ids
    channels = [agg.channel(w, overrides) for w in ids]
    if preconnect:
        for ch in channels:
            grpc.channel_ready_future(ch).result(timeout=timeout_s)
    barrier = threading.Barrier(len(ids) + 1)
    results: list[tuple[str, float]] = [("", 0.0)] * len(ids)
    attempts = [0] * len(ids)
    failures: Counter[str] = Counter()  # every failed attempt, by code and cause
    lock = threading.Lock()

    def client(i: int) -> None:
        stub = aggregator_pb2_grpc.AggregatorServiceStub(channels[i])
        request = aggregator_pb2.RegisterWorkerRequest(
            worker_id=ids[i],
            address=f"127.0.0.1:{20_000 + i}",
            site_ids=[site_id(i)],
            ready=True,  # its sites loaded: counted as registered
        )

        def attempt() -> None:
            attempts[i] += 1
            try:
                stub.RegisterWorker(request, timeout=timeout_s)
            except grpc.RpcError as exc:
                with lock:
                    failures[failure_kind(exc)] += 1
                raise

        call = retry_idempotent(WORKER_RETRY_S, max_attempts=1000)(attempt) if retry else attempt
        barrier.wait()
        t0 = time.perf_counter()
        try:
            call()
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
        t.join((WORKER_RETRY_S if retry else 0) + timeout_s + 10)
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
        retry=retry,
        attempts=sum(attempts),
        failures=dict(failures),
    )


def verdict(r: LoadResult) -> str:
    need_ok, p99_s = (1.0, 1.5) if r.retry else TARGETS.get(r.clients, (1.0, 1.5))
    answered = r.ok + r.codes.get("RESOURCE_EXHAUSTED", 0)
    good = r.alive and r.ok >= need_ok * r.clients and answered == r.clients and r.p99 <= p99_s
    return "PASS" if good else "MISS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="200,500", help="comma-separated client counts")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case (min/median/max)")
    ap.add_argument("--retry", action="store_true", help="retry as workers do")
    ap.add_argument("--baseline", action="store_true", help="also run the old client options")
    ap.add_argument("--max-concurrent-rpcs", type=int, default=0, help="the server's limit")
    ap.add_argument("--busy", type=int, default=0, help="spinning processes alongside")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--preconnect", action="store_true", help="handshake first: time the RPC alone")
    a = ap.parse_args()
    logging.getLogger("powertrip.services.common.grpc_client").setLevel(
        logging.ERROR
    )  # retry notices
    cases = [("current", ())] + ([("baseline", BASELINE_OPTIONS)] if a.baseline else [])
    rows: list[dict] = []
    print(
        f"{'options':>8} {'clients':>7} {'ok':>5} {'exhausted':>9} {'other':>5} {'tries':>5} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'srv ms':>6} {'peak MiB':>8} {'alive':>5}  target"
    )
    for n in (int(x) for x in a.clients.split(",")):
        for _ in range(a.repeats):
            for name, overrides in cases:  # interleaved: both see the same machine load
                with (
                    tempfile.TemporaryDirectory() as tmp,
                    Aggregator(Path(tmp), n, max_concurrent_rpcs=a.max_concurrent_rpcs) as agg,
                    busy_cores(a.busy),
                ):
                    r = register_all(
                        agg, preconnect=a.preconnect, retry=a.retry, overrides=overrides
                    )
                exhausted = r.codes.get("RESOURCE_EXHAUSTED", 0)
                print(
                    f"{name:>8} {n:>7} {r.ok:>5} {exhausted:>9} {r.clients - r.ok - exhausted:>5} "
                    f"{r.attempts:>5} {r.p50 * 1e3:>7.0f} {r.p99 * 1e3:>7.0f} "
                    f"{r.server_mean_s * 1e3:>6.1f} {r.peak_rss_mib:>8.0f} {str(r.alive):>5}  "
                    f"{verdict(r)} {r.failures or ''}",
                    flush=True,
                )
                rows.append(r.summary() | {"options": name, "verdict": verdict(r)})
    print("\nmin/median/max over repeats")
    for n in (int(x) for x in a.clients.split(",")):
        p99: dict[str, list[float]] = {}
        for name, _ in cases:
            mine = [row for row in rows if row["clients"] == n and row["options"] == name]
            p99[name] = [row["p99_s"] for row in mine]
            failed = [row["clients"] - row["ok"] for row in mine]
            tries = [row["attempts"] / row["clients"] for row in mine]
            print(
                f"{name:>8} {n:>4} clients: p99 {spread(p99[name])} s, failed {spread(failed)}, "
                f"attempts/client {spread(tries)}"
            )
        if a.baseline:
            ratios = [c / b for c, b in zip(p99["current"], p99["baseline"], strict=True)]
            print(f"{'':>8} {n:>4} clients: p99 current/baseline {spread(ratios)}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
