"""``powertrip up``: the profiler, the aggregator and W workers as local processes on loopback.

Every service binds port 0 and announces its ports on a READY line, so runs never collide on a
fixed port; the launcher keeps each child's PID and, on exit, stops exactly those processes.
Starting one process is ``service_process``; the ``--netns-profile`` wiring is ``netns_topology``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from powertrip.services.cli.netns_topology import Topology
from powertrip.services.cli.service_process import LaunchError, Service, start_service
from powertrip.services.common.config import ServiceConfig, load_config
from powertrip.services.common.ids import AGGREGATOR
from powertrip.v1 import aggregator_pb2

if TYPE_CHECKING:  # gRPC loads when the cluster is first asked for its status, not for --help
    import grpc

__all__ = ["ClusterPlan", "LaunchError", "LocalCluster", "Service"]


@dataclass(frozen=True)
class ClusterPlan:
    workers: int = 3
    sites: int = 12
    policy: str = "powertrip"
    clock: str = "emulated"
    # Emulated clock: run-clock seconds per wall second (POWERTRIP_PACE); 0 = as fast as possible
    pace: float = 0.0
    preset: str = "quick"
    target: float | None = None
    max_rounds: int | None = None
    seed: int | None = None
    num_samples: int | None = None
    # The workload and its data (None: the preset's); every process sees the same path.
    workload: str | None = None
    dataset_path: Path | None = None
    partition: str | None = None
    round_deadline_s: float = 60.0
    log_dir: Path = Path("results/up/logs")
    checkpoint_dir: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    # "curtailment": every service runs the curtailment mode of curtail_preset (docs/curtailment.md)
    mode: str = "powertrip"
    curtail_preset: str = "curtailment"
    # Root only: one network namespace per worker behind a tc-shaped veth to a hub namespace
    # holding the aggregator and profiler (tc-scripts/topology.sh; profile rows: name rate delay)
    netns_profile: Path | None = None
    # Mutual TLS (the default): mint a throw-away CA and one certificate per service into this
    # directory (None: log_dir's sibling "tls") and start every service with it.
    tls_dir: Path | None = None
    # Plaintext instead, only when asked: every service gets POWERTRIP_INSECURE=1.
    insecure: bool = False
    # Where the workers train and the aggregator evaluates (POWERTRIP_DEVICE): auto|cpu|cuda[:N]
    device: str = "auto"

    @property
    def tls_path(self) -> Path | None:
        """Where the certificates go; None for a plaintext (insecure) cluster."""
        if self.insecure:
            return None
        return self.tls_dir or self.log_dir.parent / "tls"

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

    def site_owners(self) -> str:
        """The aggregator's POWERTRIP_SITE_OWNERS: each worker bound to its ``site_ranges``, so
        no other certificate can claim them first (docs/site-ownership.md)."""
        pairs = zip(self.worker_ids, self.site_ranges(), strict=True)
        return ";".join(f"{wid}={sites}" for wid, sites in pairs)


class LocalCluster:
    def __init__(self, plan: ClusterPlan) -> None:
        self.plan = plan
        self.services: list[Service] = []
        self._channel: grpc.Channel | None = None
        self.topology: Topology | None = None

    # -- start -----------------------------------------------------------------------------
    def _env(self, tls_name: str | None = None, **values: object) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("POWERTRIP_")}
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
        tls = self.plan.tls_path
        if tls is None:
            env["POWERTRIP_INSECURE"] = "1"
        elif tls_name is not None:
            from powertrip.services.cli.certs import tls_env  # cryptography: when used

            env.update(tls_env(tls, tls_name))
        env.update(self.plan.extra_env)
        return env

    def _held(self, service: Service, timeout_s: float) -> Service:
        """``service`` (just started), held by the cluster and ready within ``timeout_s``."""
        self.services.append(service)  # before waiting: stop() ends it if it never gets ready
        service.wait_ready(timeout_s)
        return service

    def start(self, on_started: Callable[[Service], None] | None = None) -> None:
        p = self.plan
        hub_ns, hub_host, worker_links = None, "127.0.0.1", None
        if p.netns_profile is not None:
            self.topology = Topology.up(p.netns_profile, p.log_dir.parent / "topology")
            if len(self.topology.sites) != p.workers:
                raise LaunchError(
                    f"the profile has {len(self.topology.sites)} links; use as many workers"
                )
            hub_ns, hub_host, worker_links = (
                self.topology.hub,
                self.topology.hub_mgmt_ip,
                self.topology.sites,
            )
        # across namespaces: gRPC and /metrics on the links (metrics is loopback by default)
        bind = {"bind_host": "0.0.0.0", "metrics_addr": "0.0.0.0"} if hub_ns else {}
        if p.tls_path is not None:  # peers are verified by identity name, not by address
            from powertrip.services.cli.certs import mint_cluster  # cryptography: when used

            mint_cluster(p.tls_path, p.worker_ids)
        prof_env = self._env("profiler", **bind)
        prof = self._held(
            start_service("profiler", "profiler", prof_env, p.log_dir, hub_ns, hub_host), 60
        )
        if on_started:
            on_started(prof)
        prof_port = prof.grpc_addr.rsplit(":", 1)[1]
        agg_env = self._env(
            "aggregator",
            profiler_addr=f"127.0.0.1:{prof_port}",  # same namespace as the aggregator
            policy=p.policy,
            clock=p.clock,
            pace=p.pace or None,  # unset unless asked for
            preset=p.preset,
            target_accuracy=p.target,
            max_rounds=p.max_rounds,
            seed=p.seed,
            num_samples=p.num_samples,
            workload=p.workload,
            dataset_path=p.dataset_path,
            partition=p.partition,
            round_deadline_s=p.round_deadline_s,
            checkpoint_dir=p.checkpoint_dir or "",
            registration_timeout_s=300,
            site_owners=p.site_owners(),
            device=p.device,
            **bind,
        )
        agg = self._held(
            start_service("aggregator", "aggregator", agg_env, p.log_dir, hub_ns, hub_host), 300
        )
        if on_started:
            on_started(agg)
        agg_port = agg.grpc_addr.rsplit(":", 1)[1]
        for i, (wid, sites) in enumerate(zip(p.worker_ids, p.site_ranges(), strict=True)):
            ns, addr, hub_addr = worker_links[i] if worker_links else (None, "127.0.0.1", None)
            env = self._env(
                wid,
                aggregator_addr=f"{hub_addr or '127.0.0.1'}:{agg_port}",
                worker_id=wid,
                advertise_host=addr,
                sites=sites,
                device=p.device,
                **bind,
            )
            w = self._held(start_service(f"worker-{i}", "worker", env, p.log_dir, ns, addr), 300)
            if on_started:
                on_started(w)

    def restart(self, name: str, **env: str) -> Service:
        """SIGKILL one service and start it again on the same port (``env``: variables to
        change): workers find a restarted aggregator by their heartbeat (it resumes from its
        checkpoint), and a restarted worker registers again under its id."""
        old = next(s for s in self.services if s.name == name)
        old.process.kill()
        old.process.wait()
        self.services.remove(old)
        port = old.grpc_addr.rsplit(":", 1)[1]
        env = {**old.env, **env, "POWERTRIP_GRPC_PORT": port}
        new = start_service(name, old.kind, env, self.plan.log_dir, old.netns, old.host)
        return self._held(new, 300)

    def restart_aggregator(self) -> Service:
        return self.restart("aggregator")

    # -- watch -----------------------------------------------------------------------------
    @property
    def aggregator(self) -> Service:
        return next(s for s in self.services if s.name == "aggregator")

    def status(
        self, timeout_s: float = 5.0, after_round: int = 0
    ) -> aggregator_pb2.GetStatusResponse:
        """The run's status with every round held past ``after_round``, read page by page
        (GetStatus returns at most 1000 per reply): the last reply, all the pages' rounds."""
        from powertrip.v1 import aggregator_pb2_grpc

        if self._channel is None:
            self._channel = self.operator_channel(self.aggregator.grpc_addr)
        stub = aggregator_pb2_grpc.AggregatorServiceStub(self._channel)
        rounds: list[aggregator_pb2.RoundSummary] = []
        while True:
            ask = aggregator_pb2.GetStatusRequest(max_rounds=1000, after_round=after_round)
            reply = stub.GetStatus(ask, timeout=timeout_s)
            rounds.extend(reply.rounds)
            if not reply.more_rounds or not reply.rounds:
                break
            after_round = reply.rounds[-1].round
        del reply.rounds[:]
        reply.rounds.extend(rounds)
        return reply

    def operator_channel(self, address: str, server: str = AGGREGATOR) -> grpc.Channel:
        """mTLS as ``operator`` to the service that must prove it is ``server``, or plaintext
        when the cluster runs insecure."""
        import grpc

        from powertrip.services.cli.certs import tls_env
        from powertrip.services.common.grpc_client import make_channel

        if self.plan.tls_path is None:
            return grpc.insecure_channel(address)
        cfg = load_config(ServiceConfig, tls_env(self.plan.tls_path, "operator"))
        return make_channel(address, cfg, server)

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
        if self.topology is not None:
            self.topology.down()
            self.topology = None

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
