"""``powertrip up``: the profiler, the aggregator and W workers as local processes on loopback.

Every service binds port 0 and announces its ports on a READY line, so runs never collide on a
fixed port; the launcher keeps each child's PID and, on exit, stops exactly those processes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc
from services.cli_certs import mint_cluster, tls_env
from services.common.config import ServiceConfig, load_config
from services.common.grpc_client import make_channel

READY = re.compile(r"READY service=(\w+) grpc=(\S+) metrics=(\d+)")
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ClusterPlan:
    workers: int = 3
    sites: int = 12
    policy: str = "powertrip"
    clock: str = "emulated"
    preset: str = "quick"
    target: float | None = None
    max_rounds: int | None = None
    seed: int | None = None
    num_samples: int | None = None
    round_deadline_s: float = 60.0
    log_dir: Path = Path("results/up/logs")
    checkpoint_dir: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    # "curtailment": every service runs the curtailment mode of curtail_preset (spec §5)
    mode: str = "powertrip"
    curtail_preset: str = "curtailment"
    # Mutual TLS: mint a throw-away CA and one certificate per service into this directory and
    # start every service with it; None = plaintext.
    tls_dir: Path | None = None

    @property
    def worker_ids(self) -> list[str]:
        return [f"worker-{i}" for i in range(self.workers)]

    def site_ranges(self) -> list[str]:
        """Sites split as evenly as possible: 12 over 3 workers -> 0-3, 4-7, 8-11."""
        if not 1 <= self.workers <= self.sites:
            raise ValueError(
                f"need 1 <= workers <= sites, got {self.workers} workers, {self.sites} sites"
            )
        bounds = [round(i * self.sites / self.workers) for i in range(self.workers + 1)]
        return [f"{bounds[i]}-{bounds[i + 1] - 1}" for i in range(self.workers)]


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    grpc_addr: str = ""
    metrics_port: int = 0

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


class LaunchError(RuntimeError):
    pass


class LocalCluster:
    def __init__(self, plan: ClusterPlan) -> None:
        self.plan = plan
        self.services: list[Service] = []
        self._channel: grpc.Channel | None = None

    # -- start -----------------------------------------------------------------------------
    def _env(self, tls_name: str | None = None, **values: object) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("POWERTRIP_")}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), str(REPO_ROOT / "protos"), env.get("PYTHONPATH", "")]
        )
        if "POWERTRIP_CACHE_DIR" in os.environ:
            env["POWERTRIP_CACHE_DIR"] = os.environ["POWERTRIP_CACHE_DIR"]
        base = {
            "BIND_HOST": "127.0.0.1",
            "GRPC_PORT": 0,
            "METRICS_PORT": 0,
            "NUM_SITES": self.plan.sites,
        }
        if self.plan.mode != "powertrip":  # PowerTrip's environment stays as it was
            base |= {"MODE": self.plan.mode, "CURTAIL_PRESET": self.plan.curtail_preset}
        for key, value in {**base, **values}.items():
            if value is not None:
                env[f"POWERTRIP_{key.upper()}"] = str(value)
        if self.plan.tls_dir is not None and tls_name is not None:
            env.update(tls_env(self.plan.tls_dir, tls_name))
        env.update(self.plan.extra_env)
        return env

    def _spawn(self, name: str, module: str, env: dict[str, str], timeout_s: float) -> Service:
        self.plan.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.plan.log_dir / f"{name}.log").open("a")  # a restart appends
        proc = subprocess.Popen(
            [sys.executable, "-m", module],
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the launcher only
        )
        service = Service(name, proc)
        self.services.append(service)
        found = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                m = READY.search(line)
                if m and not found.is_set():
                    service.grpc_addr, service.metrics_port = m.group(2), int(m.group(3))
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        end = time.monotonic() + timeout_s
        while not found.wait(0.1):
            if proc.poll() is not None or time.monotonic() > end:
                tail = (self.plan.log_dir / f"{name}.log").read_text().strip().splitlines()[-3:]
                why = "exited" if proc.poll() is not None else "did not become ready"
                raise LaunchError(f"{name} {why}; last log lines: {' | '.join(tail)}")
        return service

    def start(self, on_started: Callable[[Service], None] | None = None) -> None:
        p = self.plan
        if p.tls_dir is not None:
            mint_cluster(p.tls_dir, p.worker_ids)
        prof = self._spawn("profiler", "services.profiler", self._env("profiler"), 60)
        if on_started:
            on_started(prof)
        agg_env = self._env(
            "aggregator",
            profiler_addr=prof.grpc_addr,
            policy=p.policy,
            clock=p.clock,
            preset=p.preset,
            target_accuracy=p.target,
            max_rounds=p.max_rounds,
            seed=p.seed,
            num_samples=p.num_samples,
            round_deadline_s=p.round_deadline_s,
            checkpoint_dir=p.checkpoint_dir or "",
            registration_timeout_s=300,
        )
        agg = self._spawn("aggregator", "services.aggregator", agg_env, 300)
        self._aggregator_env = agg_env
        if on_started:
            on_started(agg)
        for i, (wid, sites) in enumerate(zip(p.worker_ids, p.site_ranges(), strict=True)):
            w = self._spawn(
                f"worker-{i}",
                "services.worker",
                self._env(
                    wid,
                    aggregator_addr=agg.grpc_addr,
                    worker_id=wid,
                    advertise_host="127.0.0.1",
                    sites=sites,
                ),
                300,
            )
            if on_started:
                on_started(w)

    def restart_aggregator(self) -> Service:
        """SIGKILL the aggregator and start it again on the same port (workers find it by their
        heartbeat; it resumes from its last checkpoint)."""
        old = self.aggregator
        old.process.kill()
        old.process.wait()
        self.services.remove(old)
        port = old.grpc_addr.rsplit(":", 1)[1]
        env = {**self._aggregator_env, "POWERTRIP_GRPC_PORT": port}
        return self._spawn("aggregator", "services.aggregator", env, 300)

    # -- watch -----------------------------------------------------------------------------
    @property
    def aggregator(self) -> Service:
        return next(s for s in self.services if s.name == "aggregator")

    def status(self, timeout_s: float = 5.0) -> aggregator_pb2.GetStatusResponse:
        if self._channel is None:
            self._channel = self._operator_channel(self.aggregator.grpc_addr)
        stub = aggregator_pb2_grpc.AggregatorServiceStub(self._channel)
        return stub.GetStatus(aggregator_pb2.GetStatusRequest(), timeout=timeout_s)

    def _operator_channel(self, address: str) -> grpc.Channel:
        """Plaintext, or mTLS as ``operator`` when the cluster runs with TLS."""
        if self.plan.tls_dir is None:
            return grpc.insecure_channel(address)
        cfg = load_config(ServiceConfig, tls_env(self.plan.tls_dir, "operator"))
        return make_channel(address, cfg)

    def wait_done(
        self,
        timeout_s: float,
        on_status: Callable[[aggregator_pb2.GetStatusResponse], None] | None = None,
    ) -> aggregator_pb2.GetStatusResponse:
        """Poll the aggregator until the run ends. Only the aggregator exiting is fatal: a dead
        worker's sites fail their rounds and a dead profiler leaves the last profiles in use."""
        end = time.monotonic() + timeout_s
        while True:
            agg = self.aggregator.process
            if agg.poll() is not None:
                raise LaunchError(f"aggregator exited with code {agg.returncode}")
            st = self.status()
            if on_status:
                on_status(st)
            if st.state in (aggregator_pb2.RUN_STATE_DONE, aggregator_pb2.RUN_STATE_FAILED):
                return st
            if time.monotonic() > end:
                raise LaunchError(f"run not finished after {timeout_s:.0f} s (round {st.round})")
            time.sleep(0.2)

    # -- stop ------------------------------------------------------------------------------
    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every process this cluster started, SIGKILL what outlives the grace period."""
        if self._channel is not None:
            self._channel.close()
        for s in self.services:
            if s.process.poll() is None:
                s.process.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace_s
        for s in self.services:
            try:
                s.process.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.process.kill()
                s.process.wait()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
