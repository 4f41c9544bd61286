"""The aggregator's PowerTrip mode: wait for the sites, then drive ``run_rounds`` over the real
services, so the run makes the emulator's decisions (Algorithm 1) for the same seed.

Owns the clock (emulated or wall), the policy, the site profiles (``ProfileFeed``), checkpoints
(written while the next round runs: ``checkpoint_writer``) and the journal a restart replays, and
the round metrics; the lifecycle and status are shared with curtailment mode
(``lifecycle.RunLifecycle``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from powertrip.clock import Clock, EmulatedClock, WallClock
from powertrip.fedavg import NumpyParams
from powertrip.journal import JournaledExecutor
from powertrip.learning.device import to_numpy, to_torch
from powertrip.learning.federation import build_federation, load_workload
from powertrip.learning.tokenizer_settings import with_tokenizer_hash
from powertrip.robust import AdaptiveBound, Aggregation
from powertrip.rounds import RoundRecord, TimeModel, run_rounds
from powertrip.selection.registry import build_policy
from powertrip.services.aggregator import checkpoint, metrics
from powertrip.services.aggregator.checkpoint_writer import CheckpointWriter
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.executor import GrpcRoundExecutor
from powertrip.services.aggregator.footprint_metrics import FootprintMeter
from powertrip.services.aggregator.lifecycle import Registration, RunLifecycle
from powertrip.services.aggregator.observed_power import ObservedPower, observed_forecaster
from powertrip.services.aggregator.profile_feed import ProfileFeed
from powertrip.services.aggregator.registry import LivenessLog
from powertrip.services.aggregator.resume import Resume, journal_writer
from powertrip.services.aggregator.resume import fits_run as _fits_run
from powertrip.services.aggregator.resume import resume_state as _resume_state
from powertrip.services.aggregator.run_status import StatusRound
from powertrip.sites import SiteProfile, site_id

logger = logging.getLogger(__name__)


class AggregatorRun(RunLifecycle):
    """PowerTrip mode: the emulator's round loop (``run_rounds``) with the workers training."""

    mode = "powertrip"

    def __init__(self, cfg: AggregatorConfig) -> None:
        exp = self.experiment = cfg.experiment()
        self.power_history = ObservedPower()  # the profiler's reports: forecast, footprint
        self.forecast = observed_forecaster(exp.forecast, self.power_history)
        super().__init__(cfg, exp.num_sites, cfg.min_sites or exp.num_sites)
        self.run_seed = exp.seed
        self.target = exp.target_accuracy
        self._failed_in_a_row = 0
        self._last_failure = ""
        self._quorum_lost = False
        data = load_workload(exp, seed=exp.seed)
        # the workers get the hash of this BPE with the config, and refuse to train with another
        exp = self.experiment = with_tokenizer_hash(exp, data.tokenizer_sha256)
        fed = build_federation(exp, data, self.run_seed, cfg.device)  # evaluates there
        self._trainer, self._x_test, self._y_test = fed.trainer, fed.x_test, fed.y_test
        params = to_numpy(fed.initial_params, copy=True)
        self.clock: Clock = EmulatedClock() if cfg.clock == "emulated" else WallClock()
        self._checkpoints = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        resume = Resume([], None)
        ckpt: checkpoint.Checkpoint | None = None
        self._resumed_round: int | None = None
        outer = exp.make_outer()  # None for FedAvg; its momentum is checkpointed (R6)
        keeps_momentum = outer is not None and outer.momentum > 0
        self._fits = _fits_run(params, exp.num_sites, keeps_momentum)
        self._writer: CheckpointWriter | None = None  # checkpoints, in the background
        if self._checkpoints is not None:
            # NoUsableCheckpoint (all bad, no POWERTRIP_START_FRESH) stops the service
            ckpt = checkpoint.load_latest(self._checkpoints, self._fits, cfg.start_fresh)
            self._writer = CheckpointWriter(journal_writer(self._checkpoints, ckpt))
            if ckpt is not None:
                params = ckpt.params
                if outer is not None:
                    outer.restore(ckpt.momentum)
                self._resumed_round = ckpt.round
                resume = _resume_state(ckpt, exp.num_sites)
                logger.info("resuming after round %d: replaying %d rounds", ckpt.round, ckpt.round)
        self.model_bytes = sum(int(v.nbytes) for v in params.values())
        self.executor = GrpcRoundExecutor(
            self.registry,
            params,
            self._evaluate,
            self.run_seed,
            cfg.round_deadline_s,
            pace_by_power=cfg.clock == "wall",
            channel_cfg=cfg,
            aggregation=Aggregation.of(exp),
            min_contributions=cfg.min_contributions,
            site_weights=[len(p) for p in fed.partitions],
            outer=outer,
        )
        if ckpt is not None:  # the robust rule goes on from the checkpoint's bound
            self.executor.restore_bound(_checkpointed_bound(ckpt.state))
        # Restarts replay the journal through the round loop, so the policy resumes exactly.
        self.journaled = JournaledExecutor(self.executor, resume.journal, resume.initial)
        self.feed = ProfileFeed(cfg, exp.num_sites, stop=self._stop)
        self.liveness = LivenessLog(self.registry, self._stop, cfg.round_deadline_s, resume.down)
        tau = self.time_model.ideal_compute_s  # the wall tau on a wall clock
        self.footprint = FootprintMeter(exp, self.power_history, tau)
        if self.target is not None:
            metrics.TARGET.set(self.target)

    # -- pieces the round loop calls -------------------------------------------------------
    def _evaluate(self, params: NumpyParams) -> tuple[float, float]:
        return self._trainer.evaluate(to_torch(params), self._x_test, self._y_test)

    @property
    def time_model(self) -> TimeModel:
        exp = self.experiment
        if self.cfg.clock == "emulated":
            return TimeModel(
                exp.ideal_compute_s, exp.update_bytes, exp.ground_truth, exp.round_trip
            )
        return TimeModel(self.cfg.wall_tau_s, float(self.model_bytes), exp.ground_truth, True)

    def link_of(self, site: int) -> tuple[float, float] | None:
        """The site's measured link (RTT seconds, bytes per second), or None: uploads' credit."""
        return self.feed.links.get(site)

    def profile_at(self, t_s: float) -> SiteProfile:
        """Site profiles from the profiler (or its cache, ``ProfileFeed``), masked by the
        workers' leases: sites of a dead or frozen worker are not selected. A replayed round
        gets the mask it had, so a restarted run selects as before."""
        r = self.status.round + 1  # the round this profile is for (written by this thread)
        replaying = self.journaled.replaying(r)
        if not replaying:
            self.liveness.wait_for_a_site()
        profile = self.feed.site_profiles(t_s, self.time_model)
        self.power_history.record(t_s, profile.power)  # what the forecast is fitted on
        return self.liveness.mask(r, profile, replaying)

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
        if rec.outcome == "failed":
            failure = self.executor.failure
            reason = failure[1] if failure and failure[0] == rec.round else "no_update"
            self._last_failure = reason
            if not self.journaled.replaying(rec.round):
                metrics.ROUND_FAILURES.labels(reason).inc()
        if self._failed_in_a_row >= self.cfg.max_failed_rounds:
            self._quorum_lost = True
            self._stop.set()
        reached = self.target is not None and rec.accuracy >= self.target
        self._record_round(StatusRound(rec), rec.time_s if reached else None)
        replayed = self.journaled.replaying(rec.round)
        if not replayed:  # a replayed round was counted before the restart
            self.footprint.count(rec)
        self._stage_journal(rec.round)
        if self._writer is not None and rec.outcome == "completed" and not replayed:
            # written while the next round runs; durable before the next one is started
            self._writer.submit(
                rec.round,
                self.executor.params,
                {
                    "clock_s": rec.time_s,
                    "accuracy": rec.accuracy,
                    "policy": strategy,
                    "initial": list(self.journaled.evaluate_initial()),
                    # the robust rule's bound for the next round (absent for other rules)
                    **(
                        {}
                        if self.executor.bound is None
                        else {"aggregation": self.executor.bound.state_dict()}
                    ),
                },
                None if self.executor.outer is None else self.executor.outer.state,
            )
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
        self._pace(rec.time_s, replayed)

    def _stage_journal(self, round_index: int) -> None:
        """Hand the rounds run live so far, with their availability masks, to the checkpoint
        writer (the next checkpoint appends them to the journal file); the masks up to this
        round are not needed again (a replayed round's mask was used before it ran)."""
        down = self.liveness.down
        new = [
            replace(e, unavailable=tuple(down.get(e.round, ()))) for e in self.journaled.take_new()
        ]
        if self._writer is not None:
            self._writer.stage(e.to_json() for e in new)
        for r in [r for r in down if r <= round_index]:
            del down[r]

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def policy_name(self) -> str:
        return self.cfg.policy

    def registration(self) -> Registration:
        return Registration(
            self.run_seed, self.mode, run_config_json=self.experiment.model_dump_json()
        )

    def _train(self) -> None:
        self._begin_training()
        exp = self.experiment
        policy = build_policy(
            self.cfg.policy,
            k_star=self.cfg.k_star,
            greedy_overrides=exp.greedy.overrides(),
            round_time_model=exp.ground_truth,
        )
        # Keep the last global delta (a strided sketch) only for a policy that uses it.
        self.executor.track_direction = policy.wants_direction
        if self.executor.track_direction and self._resumed_round is not None:
            assert self._checkpoints is not None
            before = checkpoint.load_round(self._checkpoints, self._resumed_round - 1, self._fits)
            if before is not None:
                self.executor.resume_direction(before.params)
            else:
                logger.warning("no checkpoint before the resumed one: next round unprojected")
        try:
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
                forecast=self.forecast,
            )
        finally:  # the last checkpoint is durable before the run ends, however it ends
            if self._writer is not None:
                self._writer.wait()
        if self._quorum_lost:
            n, why = self.cfg.max_failed_rounds, self._last_failure
            if why == "quorum":
                self._fail(
                    f"{n} rounds in a row without a quorum of {self.cfg.min_contributions} updates"
                )
            else:
                self._fail(f"{n} rounds in a row without any update ({why})")
            return
        reached = self.status.time_to_accuracy_s  # written by this thread only
        self._finish(
            f"target {self.target} reached at {reached:.1f} s"
            if reached is not None
            else f"stopped after round {self.status.round}"
            if self._stopping
            else "round budget exhausted before the target"
        )


def _checkpointed_bound(state: dict) -> AdaptiveBound | None:
    """The robust rule's bound a checkpoint holds (None: written by another rule's run, which
    the configuration digest refuses anyway); ValueError naming a damaged field."""
    if "aggregation" not in state:
        return None
    return AdaptiveBound.from_state_dict(state["aggregation"])
