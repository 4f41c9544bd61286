"""The aggregator's PowerTrip mode: wait for the sites, then drive ``run_rounds`` over the real
services, so the run makes the emulator's decisions (Algorithm 1) for the same seed.

Owns the clock (emulated or wall), the policy, the site profiles (``ProfileFeed``), checkpoints
(written while the next round runs: ``checkpoint_writer``; each holds every state a resume needs,
assembled by ``AggregatorRun.checkpoint_components``), the round journal (the run's history, for
the status) and the round metrics; the lifecycle and status are shared with curtailment mode
(``lifecycle.RunLifecycle``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from powertrip.aggregation.outer_step import outer_for
from powertrip.aggregation.robust import Aggregation
from powertrip.aggregation.robust_fedavg import AdaptiveBound
from powertrip.config.tokenizer import with_tokenizer_hash
from powertrip.federation import build_federation, load_workload
from powertrip.learning.device import to_numpy, to_torch
from powertrip.learning.model_file import model_card
from powertrip.learning.params import NumpyParams
from powertrip.learning.site_params import running_statistics
from powertrip.rounds.clock import Clock, EmulatedClock, WallClock
from powertrip.rounds.journal import JournaledExecutor
from powertrip.rounds.loop import RoundLoop, RoundRecord, TimeModel
from powertrip.selection.base import SelectionPolicy
from powertrip.selection.registry import PolicyContext, build_policy
from powertrip.services.aggregator import checkpoint, journal_file, metrics
from powertrip.services.aggregator.checkpoint_writer import CheckpointWriter
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.executor import GrpcRoundExecutor
from powertrip.services.aggregator.footprint_metrics import FootprintMeter
from powertrip.services.aggregator.lifecycle import Registration, RunLifecycle
from powertrip.services.aggregator.observed_power import ObservedPower, observed_forecaster
from powertrip.services.aggregator.profile_feed import ProfileFeed
from powertrip.services.aggregator.registry import LivenessLog
from powertrip.services.aggregator.resume import fits_run, run_digest
from powertrip.services.aggregator.run_status import StatusRound
from powertrip.services.aggregator.served_model import ServedModel
from powertrip.services.common.fault_points import fault_point
from powertrip.sites.profiles import SiteProfile, site_id
from powertrip.state_dict import fields, number

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
        self.run_id = run_digest(
            {
                "experiment": json.loads(exp.model_dump_json()),
                "policy": cfg.policy,
                "k_star": cfg.k_star,
                "clock": cfg.clock,
            }
        )
        self.policy = self._build_policy()
        ckpt: checkpoint.Checkpoint | None = None
        outer = outer_for(exp)  # None for FedAvg; its momentum is checkpointed (R6)
        keeps_momentum = outer is not None and outer.momentum > 0
        self._fits = fits_run(params, self.run_id, self._check_components, keeps_momentum)
        self._writer: CheckpointWriter | None = None  # checkpoints, in the background
        history = journal_file.Recovery([], journal_file.JournalFile(Path()))
        if self._checkpoints is not None:
            # NoUsableCheckpoint (all bad, no POWERTRIP_START_FRESH) stops the service
            ckpt = checkpoint.load_latest(self._checkpoints, self._fits, cfg.start_fresh)
            # the history up to the checkpoint; its damage is reported, never a rejection
            history = journal_file.recover(self._checkpoints, 0 if ckpt is None else ckpt.round)
            self._writer = CheckpointWriter(history.writer)
            if ckpt is not None:
                params = ckpt.params
                if outer is not None:
                    outer.restore(ckpt.momentum)
        self.model_bytes = sum(int(v.nbytes) for v in params.values())
        # the model GetModel hands out and the run leaves in its checkpoint directory
        card = model_card(exp, data, policy=cfg.policy, source="aggregator")
        self.served = ServedModel(fed.trainer.model, params, card)
        self.executor = GrpcRoundExecutor(
            self.registry,
            params,
            self._evaluate,
            self.run_seed,
            cfg.round_deadline_s,
            pace_by_power=cfg.clock == "wall",
            channel_cfg=cfg,
            aggregation=replace(
                Aggregation.of(exp), statistics=running_statistics(fed.trainer.model)
            ),
            min_contributions=cfg.min_contributions,
            site_weights=[len(p) for p in fed.partitions],
            outer=outer,
        )
        # Keep the last global delta (a strided sketch) only for a policy that uses it.
        self.executor.track_direction = self.policy.wants_direction
        self.journaled = JournaledExecutor(self.executor)  # the rounds, for the journal
        self.feed = ProfileFeed(cfg, exp.num_sites, stop=self._stop)
        self.liveness = LivenessLog(self.registry, self._stop, cfg.round_deadline_s)
        tau = self.time_model.ideal_compute_s  # the wall tau on a wall clock
        self.footprint = FootprintMeter(exp, self.power_history, tau)
        self.loop = RoundLoop(
            self.policy,
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
        if ckpt is not None:  # checked by ``_fits`` at load: this cannot fail half-way
            self._restore(ckpt.state["components"], self.policy, self.loop, self.executor)
            self._resume_status(ckpt.round, history.entries)
            self.served.publish(params, ckpt.round, self.loop.accuracy, self.loop.loss)
            logger.info("resuming after round %d from its checkpoint (no replay)", ckpt.round)
        if self.target is not None:
            metrics.TARGET.set(self.target)

    # -- the checkpoint's state ------------------------------------------------------------
    def _build_policy(self) -> SelectionPolicy:
        exp = self.experiment
        return build_policy(
            self.cfg.policy,
            PolicyContext(
                k_star=self.cfg.k_star,
                greedy_overrides=exp.greedy.overrides(),
                round_time_model=exp.ground_truth,
            ),
        )

    def checkpoint_components(self) -> dict[str, Any]:
        """THE one place a checkpoint's run state is assembled: every component's
        ``state_dict()`` by name (numbers, lists, dicts and numpy arrays, copies taken now: the
        checkpoint is written while the next round runs). ``_restore`` is its inverse; a new
        piece of state that is carried between rounds goes in both, under a name of its own.
        (The model and the outer step's momentum are the checkpoint's arrays, not components.)
        """
        bound = self.executor.bound
        direction = self.executor._direction if self.executor.track_direction else None
        return {
            "policy": self.policy.state_dict(),  # what Algorithm 1 / the baseline learnt
            "loop": self.loop.state_dict(),  # round, accuracy, loss, random stream, clock
            # the robust rule's bound for the next round (None: a rule without one)
            "aggregation": None if bound is None else bound.state_dict(),
            # the last global delta's sketch the next round projects on (directional gain)
            "direction": None if direction is None else dict(direction),
            "status": {"time_to_accuracy_s": self.status.time_to_accuracy_s},
            # the profiler's reports, for a forecast fitted on the past (ewma; None otherwise:
            # persistence reads only the report of the round itself)
            "power_history": (
                self.power_history.state_dict() if self.experiment.forecast == "ewma" else None
            ),
        }

    def _restore(
        self,
        components: Mapping[str, Any],
        policy: SelectionPolicy,
        loop: RoundLoop,
        executor: GrpcRoundExecutor | None,
    ) -> None:
        """Put ``checkpoint_components``' value into ``policy``, ``loop`` and ``executor``
        (None: only check it). TypeError or ValueError naming the field that does not fit."""
        keys = {"policy", "loop", "aggregation", "direction", "status", "power_history"}
        c = fields(components, "state.components", keys)
        status = fields(c["status"], "state.components.status", {"time_to_accuracy_s"})
        reached = number(status["time_to_accuracy_s"], "state.components.status", optional=True)
        bound = (
            None if c["aggregation"] is None else AdaptiveBound.from_state_dict(c["aggregation"])
        )
        direction = c["direction"]
        if direction is not None:
            if not isinstance(direction, dict):
                raise TypeError("state.components.direction is not a mapping of arrays")
            if not all(isinstance(v, np.ndarray) for v in direction.values()):
                raise TypeError("state.components.direction holds a value that is not an array")
        history = ObservedPower()
        if c["power_history"] is not None:
            history.load_state_dict(c["power_history"])
        policy.load_state_dict(c["policy"])
        loop.load_state_dict(c["loop"])
        if executor is not None:
            self.power_history.load_state_dict(history.state_dict())
            executor.restore_bound(bound)
            if executor.track_direction and direction is not None:
                executor._direction = direction
            self.status.time_to_accuracy_s = reached

    def _check_components(self, components: Mapping[str, Any]) -> None:
        """``_restore`` into a throwaway policy and loop of this run's configuration."""
        policy = self._build_policy()
        loop = RoundLoop(
            policy,
            None,  # type: ignore[arg-type]  # never run
            self.profile_at,
            TimeModel(1.0, 1.0),
            EmulatedClock(),
            self.run_seed,
            self.target,
            self.experiment.max_rounds,
        )
        self._restore(components, policy, loop, None)

    def _resume_status(self, round_index: int, history: list) -> None:
        """The status of a run resumed after ``round_index``: its rounds from the journal (as
        far as it is intact), its progress from the checkpoint."""
        loop = self.loop
        previous = loop.initial or (0.0, 0.0)
        rows = []
        for entry in history:
            rec = entry.record(previous)
            previous = (rec.accuracy, rec.loss)
            rows.append(StatusRound(rec))
        self._restore_status(rows, round_index, loop.accuracy, self.clock.now())
        metrics.ROUND_CURRENT.set(round_index)
        metrics.ACCURACY.set(loop.accuracy)
        metrics.LOSS.set(loop.loss)
        metrics.CLOCK.set(self.clock.now())

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
        workers' leases: sites of a dead or frozen worker are not selected."""
        r = self.loop.round + 1  # the round this profile is for
        self.liveness.wait_for_a_site()
        profile = self.feed.site_profiles(t_s, self.time_model)
        self.power_history.record(t_s, profile.power)  # what the forecast is fitted on
        return self.liveness.mask(r, profile, False)

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
            metrics.ROUND_FAILURES.labels(reason).inc()
        if self._failed_in_a_row >= self.cfg.max_failed_rounds:
            self._quorum_lost = True
            self._stop.set()
        reached = self.target is not None and rec.accuracy >= self.target
        self._record_round(StatusRound(rec), rec.time_s if reached else None)
        self.footprint.count(rec)
        self._stage_journal(rec)
        if rec.outcome == "completed":  # a failed round left the model as it was
            self.served.publish(self.executor.params, rec.round, rec.accuracy, rec.loss)
        if self._writer is not None and rec.outcome == "completed":
            # written while the next round runs; durable before the next one is started
            self._writer.submit(
                rec.round,
                self.executor.params,
                {
                    "run": self.run_id,
                    "clock_s": rec.time_s,
                    "accuracy": rec.accuracy,
                    "policy": strategy,
                    "components": self.checkpoint_components(),
                },
                None if self.executor.outer is None else self.executor.outer.state,
            )
        logger.info(
            "round %d: %d sites, %d updates, accuracy %.4f, clock %.1f s (%s)",
            rec.round,
            rec.sites,
            rec.contributions,
            rec.accuracy,
            rec.time_s,
            rec.outcome,
        )
        self._pace(rec.time_s)

    def _stage_journal(self, rec: RoundRecord) -> None:
        """Hand the round just run, with its availability mask and clock, to the checkpoint
        writer (the next checkpoint appends it to the journal file); the masks up to this round
        are not needed again."""
        down = self.liveness.down
        new = [
            replace(
                e,
                unavailable=tuple(down.get(e.round, ())),
                time_s=rec.time_s if e.round == rec.round else None,
                duration_s=rec.duration_s if e.round == rec.round else None,
            )
            for e in self.journaled.take_new()
        ]
        if self._writer is not None:
            self._writer.stage(e.to_json() for e in new)
        for r in [r for r in down if r <= rec.round]:
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
        if self.loop.round > 0:  # test hook: a restored run dies with its sites back, at once
            fault_point("resumed", self.loop.round + 1)
        self._pacer.restart(self.clock.now())  # a resumed run paces on from its clock
        try:
            self.loop.run()
        finally:  # the last checkpoint is durable before the run ends, however it ends
            if self._writer is not None:
                self._writer.wait()
        self.served.write(self._checkpoints)  # however the rounds ended: the last model
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
