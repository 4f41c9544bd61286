"""The aggregator's run: wait for the sites, then drive ``run_rounds`` over the real services.

Owns the clock (emulated or wall), the policy, the profile feed from the profiler (cached when
the profiler is slow or down), checkpoints, status and metrics.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

import grpc
import numpy as np
import torch

from powertrip.clock import Clock, EmulatedClock, WallClock
from powertrip.fedavg import NumpyParams
from powertrip.learning.federation import build_federation, load_workload
from powertrip.rounds import (
    JournaledExecutor,
    JournalEntry,
    RoundRecord,
    TimeModel,
    run_rounds,
)
from powertrip.selection.registry import build_policy
from powertrip.sites import SiteProfile, site_id, site_index
from powertrip.timing import comm_time_s
from powertrip.v1 import profiler_pb2, profiler_pb2_grpc
from services.aggregator import checkpoint, metrics
from services.aggregator.config import AggregatorConfig
from services.aggregator.executor import GrpcRoundExecutor
from services.aggregator.registry import WorkerRegistry
from services.common.grpc_client import make_channel, retry_idempotent

logger = logging.getLogger(__name__)


class RunState(IntEnum):  # values match powertrip.v1.RunState
    WAITING_FOR_SITES = 1
    TRAINING = 2
    DONE = 3
    FAILED = 4


@dataclass
class RunStatus:
    state: RunState = RunState.WAITING_FOR_SITES
    round: int = 0
    accuracy: float = 0.0
    clock_s: float = 0.0
    time_to_accuracy_s: float | None = None
    message: str = ""
    rounds: list[RoundRecord] = field(default_factory=list)
    mode: str = ""  # curtailment mode: "pause", "solo" or "federated"
    active_sites: int = 0


def wait_for_sites(
    registry: WorkerRegistry, expected: int, timeout_s: float, stop: threading.Event
) -> str | None:
    """None once ``expected`` sites are registered; otherwise why not ("" when stopped)."""
    end = time.monotonic() + timeout_s
    while registry.site_count < expected:
        if stop.is_set():
            return ""
        if time.monotonic() > end:
            n = registry.site_count
            return f"only {n} of {expected} sites registered within {timeout_s:.0f} s"
        time.sleep(0.1)
    return None


class AggregatorRun:
    mode = "powertrip"
    energy = None  # curtailment mode only (CurtailmentRun)

    def __init__(self, cfg: AggregatorConfig) -> None:
        self.cfg = cfg
        self.experiment = cfg.experiment()
        exp = self.experiment
        self.run_seed = exp.seed
        self.target = exp.target_accuracy
        self.registry = WorkerRegistry(exp.num_sites)
        self.status = RunStatus()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failed_in_a_row = 0
        self._quorum_lost = False
        data = load_workload(exp, seed=exp.seed)
        fed = build_federation(exp, data, self.run_seed)
        self._trainer, self._x_test, self._y_test = fed.trainer, fed.x_test, fed.y_test
        params: NumpyParams = {k: v.numpy().copy() for k, v in fed.initial_params.items()}
        self.clock: Clock = EmulatedClock() if cfg.clock == "emulated" else WallClock()
        self._checkpoints = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        journal: list[JournalEntry] = []
        initial: tuple[float, float] | None = None
        self._resumed_round: int | None = None
        if self._checkpoints is not None:
            ckpt = checkpoint.load_latest(self._checkpoints)
            if ckpt is not None:
                params = ckpt.params
                self._resumed_round = ckpt.round
                journal = [JournalEntry.from_json(e) for e in ckpt.state.get("journal", [])]
                initial = tuple(ckpt.state["initial"]) if "initial" in ckpt.state else None
                logger.info(
                    "resuming after round %d: replaying %d rounds", ckpt.round, len(journal)
                )
        self.model_bytes = sum(int(v.nbytes) for v in params.values())
        self.executor = GrpcRoundExecutor(
            self.registry,
            params,
            self._evaluate,
            self.run_seed,
            cfg.round_deadline_s,
            pace_by_power=cfg.clock == "wall",
            channel_cfg=cfg,
        )
        # Restarts replay the journal through the round loop, so the policy resumes exactly.
        self.journaled = JournaledExecutor(self.executor, journal, initial)
        self._profiler = profiler_pb2_grpc.ProfilerServiceStub(make_channel(cfg.profiler_addr, cfg))
        self._last_profile: SiteProfile | None = None
        if self.target is not None:
            metrics.TARGET.set(self.target)
        metrics.TIME_TO_ACCURACY.set(math.nan)

    # -- pieces the round loop calls -------------------------------------------------------
    def _evaluate(self, params: NumpyParams) -> tuple[float, float]:
        tensors = {k: torch.from_numpy(v) for k, v in params.items()}
        return self._trainer.evaluate(tensors, self._x_test, self._y_test)

    @property
    def time_model(self) -> TimeModel:
        exp = self.experiment
        if self.cfg.clock == "emulated":
            return TimeModel(
                exp.ideal_compute_s, exp.update_bytes, exp.ground_truth, exp.round_trip
            )
        return TimeModel(self.cfg.wall_tau_s, float(self.model_bytes), exp.ground_truth, True)

    def profile_at(self, t_s: float) -> SiteProfile:
        """Site profiles from the profiler; the last good answer when it does not reply."""

        @retry_idempotent(max_seconds=self.cfg.rpc_timeout_s, max_attempts=3)
        def fetch() -> profiler_pb2.GetSiteProfilesResponse:
            return self._profiler.GetSiteProfiles(
                profiler_pb2.GetSiteProfilesRequest(time_seconds=t_s),
                timeout=self.cfg.rpc_timeout_s,
            )

        try:
            reply = fetch()
        except grpc.RpcError as exc:
            if self._last_profile is None:
                raise
            logger.warning("profiler unavailable (%s); using the last profile", exc.code())
            return self._last_profile
        self._last_profile = self._to_profile(reply)
        return self._last_profile

    def _to_profile(self, reply: profiler_pb2.GetSiteProfilesResponse) -> SiteProfile:
        n = self.experiment.num_sites
        rows = sorted(reply.sites, key=lambda p: site_index(p.site_id))
        if [site_index(p.site_id) for p in rows] != list(range(n)):
            raise RuntimeError(
                f"the profiler serves {len(rows)} sites but this run has {n}: "
                "set the same POWERTRIP_NUM_SITES for both"
            )
        measured = self.cfg.clock == "wall"
        latency = np.array(
            [
                p.rtt_seconds / 2
                if measured and p.measured_at_seconds > 0
                else p.modelled_latency_seconds
                for p in rows
            ]
        )
        bandwidth_bits = 8 * np.array(
            [
                p.bandwidth_bytes_per_second
                if measured and p.measured_at_seconds > 0
                else p.modelled_bandwidth_bytes_per_second
                for p in rows
            ]
        )
        tm = self.time_model
        return SiteProfile(
            power=np.array([p.power_fraction for p in rows]),
            comm_s=comm_time_s(latency, bandwidth_bits, tm.update_bytes, round_trip=tm.round_trip),
            distance_mi=np.array([p.distance_miles for p in rows]),
        )

    def _on_round(self, rec: RoundRecord) -> None:
        strategy = self.cfg.policy
        metrics.ROUNDS.labels(rec.outcome).inc()
        metrics.ROUND_DURATION.labels(strategy).observe(rec.duration_s)
        metrics.ROUND_CURRENT.set(rec.round)
        metrics.SITES_SELECTED.set(rec.sites)
        for s in rec.selected:
            metrics.SITE_SELECTED.labels(site_id(s)).inc()
        metrics.ACCURACY.set(rec.accuracy)
        metrics.LOSS.set(rec.loss)
        metrics.CLOCK.set(rec.time_s)
        self._failed_in_a_row = self._failed_in_a_row + 1 if rec.outcome == "failed" else 0
        if self._failed_in_a_row >= self.cfg.max_failed_rounds:
            self._quorum_lost = True
            self._stop.set()
        with self._lock:
            st = self.status
            st.round, st.accuracy, st.clock_s = rec.round, rec.accuracy, rec.time_s
            st.rounds.append(rec)
            reached = self.target is not None and rec.accuracy >= self.target
            if reached and st.time_to_accuracy_s is None:
                st.time_to_accuracy_s = rec.time_s
                metrics.TIME_TO_ACCURACY.set(rec.time_s)
        replayed = self.journaled.replaying(rec.round)
        if self._checkpoints is not None and rec.outcome == "completed" and not replayed:
            checkpoint.save(
                self._checkpoints,
                rec.round,
                self.executor.params,
                {
                    "clock_s": rec.time_s,
                    "accuracy": rec.accuracy,
                    "policy": strategy,
                    "initial": list(self.journaled.evaluate_initial()),
                    "journal": [e.to_json() for e in self.journaled.journal],
                },
            )
            metrics.CHECKPOINT_ROUND.set(rec.round)
        logger.info(
            "round %d: %d sites, %d updates, accuracy %.4f, clock %.1f s (%s%s)",
            rec.round,
            rec.sites,
            rec.contributions,
            rec.accuracy,
            rec.time_s,
            rec.outcome,
            ", replayed" if replayed else "",
        )

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def policy_name(self) -> str:
        return self.cfg.policy

    @property
    def expected_sites(self) -> int:
        return self.cfg.min_sites or self.experiment.num_sites

    def _wait_for_sites(self) -> bool:
        why = wait_for_sites(
            self.registry, self.expected_sites, self.cfg.registration_timeout_s, self._stop
        )
        if why:
            self._fail(why)
        return why is None

    def _fail(self, message: str) -> None:
        logger.error("run failed: %s", message)
        with self._lock:
            self.status.state, self.status.message = RunState.FAILED, message

    def run(self) -> None:
        try:
            if not self._wait_for_sites():
                return
            with self._lock:
                self.status.state = RunState.TRAINING
            exp = self.experiment
            policy = build_policy(
                self.cfg.policy,
                k_star=self.cfg.k_star,
                greedy_overrides=exp.greedy.overrides(),
                round_time_model=exp.ground_truth,
            )
            # Keep the last global delta (one model-sized copy) only for a policy that uses it.
            self.executor.track_direction = getattr(policy, "wants_direction", False)
            if self.executor.track_direction and self._resumed_round is not None:
                assert self._checkpoints is not None
                before = checkpoint.load_round(self._checkpoints, self._resumed_round - 1)
                if before is not None:
                    self.executor.resume_direction(before.params)
                else:
                    logger.warning("no checkpoint before the resumed one: next round unprojected")
            run_rounds(
                policy,
                self.journaled,
                self.profile_at,
                self.time_model,
                self.clock,
                self.run_seed,
                self.target,
                exp.max_rounds,
                on_round=self._on_round,
                should_stop=self._stop.is_set,
            )
            if self._quorum_lost:
                self._fail(f"{self.cfg.max_failed_rounds} rounds in a row without any update")
                return
            with self._lock:
                self.status.state = RunState.DONE
                reached = self.status.time_to_accuracy_s
                self.status.message = (
                    f"target {self.target} reached at {reached:.1f} s"
                    if reached is not None
                    else "round budget exhausted before the target"
                )
            logger.info("run done: %s", self.status.message)
        except Exception as exc:
            logger.exception("run crashed")
            self._fail(f"{type(exc).__name__}: {exc}")

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="aggregator-run", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
        self.executor.close()
