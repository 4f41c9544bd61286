"""The aggregator's curtailment mode, the curtailment-aware elastic training of
docs/curtailment.md: the emulator's ``ElasticEngine`` plays the run on an emulated clock, with
availability and the carbon trace from the profiler's ``GetAvailability`` and the training done
by the workers (``GrpcLearner``).

The scheduling, the data cursor, the round arithmetic and the energy accounting are the
emulator's own code, so a service run makes the decisions and reports the energy and emissions
of ``powertrip curtail``'s curtailment run for the same settings. Checkpointed after every
round as PowerTrip mode is (format 4, the run's digest, components' ``state_dict``): a restarted
aggregator resumes from the newest intact checkpoint and ends bit-identical (R37). A site whose
update does not arrive is left out of its sub-round (``grpc_learner``); a round in which none
arrives fails (the model unchanged, its rows back to the pool), and ``max_failed_rounds`` of them
in a row fail the run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from powertrip.config.tokenizer import with_tokenizer_hash
from powertrip.curtailment.cursor import ShardCursor
from powertrip.curtailment.emissions import EnergyReport, account
from powertrip.curtailment.engine import ElasticEngine, ElasticState
from powertrip.curtailment.run_model import ElasticRound, ElasticRun, ElasticSite
from powertrip.curtailment.sites import build_sites
from powertrip.federation import StreamSetup
from powertrip.learning.device import TorchParams, to_numpy, to_torch
from powertrip.learning.model_file import model_card
from powertrip.rounds.loop import RoundRecord, policy_rng
from powertrip.selection.base import SelectionPolicy
from powertrip.selection.registry import PolicyContext, build_policy
from powertrip.services.aggregator import checkpoint, journal_file, metrics
from powertrip.services.aggregator.checkpoint_writer import CheckpointWriter
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.executor import GrpcRoundExecutor
from powertrip.services.aggregator.grpc_learner import GrpcLearner
from powertrip.services.aggregator.lifecycle import Registration, RunLifecycle
from powertrip.services.aggregator.profile_feed import ProfileFeed
from powertrip.services.aggregator.resume import fits_run, run_digest
from powertrip.services.aggregator.run_status import StatusRound
from powertrip.services.aggregator.served_model import ServedModel
from powertrip.sites.profiles import site_id
from powertrip.state_dict import fields
from powertrip.study.curtailment import build_engine
from powertrip.traces.carbon import CarbonTrace

logger = logging.getLogger(__name__)

MODE_VALUE = {"pause": 0, "solo": 1, "federated": 2}


class TooManyFailedRounds(RuntimeError):
    """``max_failed_rounds`` rounds in a row in which no site's update arrived."""


class CurtailmentRun(RunLifecycle):
    """Curtailment mode: the elastic engine's run, each sub-round trained on the workers.

    Checkpointed after every round like PowerTrip mode (``checkpoint``, ``CheckpointWriter``,
    the run's digest): the model and outer momentum as arrays, and the components a resume
    needs (``checkpoint_components``). A restart resumes from the newest one that verifies and
    plays on bit-identically; the status's rounds come back from the checkpointed record.
    """

    mode = "curtailment"
    thread_name = "curtailment-run"

    def __init__(self, cfg: AggregatorConfig) -> None:
        config = self.config = cfg.curtailment()
        num_sites = cfg.num_sites or (
            len(config.regions) * config.sites_per_region if config.regions else None
        )
        if num_sites is None:
            raise ValueError("curtailment mode needs POWERTRIP_NUM_SITES or POWERTRIP_REGIONS")
        super().__init__(cfg, num_sites, cfg.min_sites or num_sites)
        self.num_sites = num_sites
        self.run_seed = config.seed
        self.target = cfg.target_accuracy
        self.setup = StreamSetup.load(self.config, cfg.device)  # evaluates there
        # the workers get the hash of this BPE with the config, and refuse to train with another
        self.config = with_tokenizer_hash(self.config, self.setup.data.tokenizer_sha256)
        self.rounds = self.setup.wall_clock_rounds()
        x_test, y_test = self.setup.eval_set
        trainer = self.setup.trainer
        params = to_numpy(self.setup.params, copy=True)
        self.run_id = run_digest(
            {
                "mode": self.mode,
                "curtailment": json.loads(self.config.model_dump_json()),
                "policy": cfg.curtail_policy,
            }
        )
        outer = self.setup.outer()
        keeps_momentum = outer is not None and outer.momentum > 0
        fits = fits_run(params, self.run_id, self._check_components, keeps_momentum)
        self._checkpoints = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        self._writer: CheckpointWriter | None = None
        self._resume: checkpoint.Checkpoint | None = None
        if self._checkpoints is not None:
            # a run whose rounds have not stepped the outer optimizer yet (none trained) has
            # no momentum to check; NoUsableCheckpoint (all bad) stops the service
            self._resume = checkpoint.load_latest(
                self._checkpoints,
                lambda c: fits(c if c.momentum is not None else replace(c, round=0)),
                cfg.start_fresh,
            )
            self._writer = CheckpointWriter(journal_file.JournalFile(self._checkpoints))
            if self._resume is not None:
                params = self._resume.params
                if outer is not None:
                    outer.restore(self._resume.momentum)

        def evaluate(p: TorchParams) -> tuple[float, float]:
            return trainer.evaluate(p, x_test, y_test)

        self.executor = GrpcRoundExecutor(  # the transport: channels, broadcast, update checks
            self.registry,
            params,
            lambda p: evaluate(to_torch(p)),
            self.run_seed,
            cfg.round_deadline_s,
            pace_by_power=False,
            channel_cfg=cfg,
        )
        self.learner = GrpcLearner(
            self.executor,
            to_torch(params),
            evaluate,
            self.config.batch_size,
            self.run_seed,
            cfg.round_deadline_s,
            outer,
            self.setup.aggregation(),
        )
        self.feed = ProfileFeed(cfg, num_sites)
        # the model GetModel hands out and the run leaves in its checkpoint directory
        card = model_card(
            self.config, self.setup.data, policy=self.policy_name, source="aggregator"
        )
        self.served = ServedModel(trainer.model, params, card)
        self._reported: dict[str, tuple[float, float]] = {}  # site -> (kWh, g) already counted
        self._failed_in_a_row = 0
        if self._resume is not None:
            logger.info(
                "resuming after round %d from its checkpoint (no replay)", self._resume.round
            )

    @property
    def policy_name(self) -> str:
        return self.cfg.curtail_policy

    def registration(self) -> Registration:
        return Registration(
            self.run_seed, self.mode, curtail_config_json=self.config.model_dump_json()
        )

    # -- the checkpoint's state ------------------------------------------------------------
    def checkpoint_components(
        self, policy: SelectionPolicy, cursor: ShardCursor, state: ElasticState
    ) -> dict[str, Any]:
        """THE one place this mode's checkpoint state is assembled (``_restore`` is its
        inverse): every component's ``state_dict()`` by name, copies taken now (the checkpoint
        is written while the next round trains). The model and the outer momentum are the
        checkpoint's arrays."""
        return {
            "policy": policy.state_dict(),  # what a learning policy learnt (curtailment: {})
            "cursor": cursor.state_dict(),  # each shard's progress
            # the record so far, the policy's random stream, the clock, the current evaluation
            "engine": state.state_dict(),
            # the robust rule's bound, the evaluation, the sub-round and round counters
            "learner": self.learner.state_dict(),
        }

    def _restore(
        self,
        components: Mapping[str, Any],
        policy: SelectionPolicy,
        cursor: ShardCursor,
        state: ElasticState,
        learner: GrpcLearner | None,
    ) -> None:
        """Put ``checkpoint_components``' value into the objects (``learner`` None: only
        check it); TypeError or ValueError naming the field that does not fit."""
        c = fields(components, "state.components", {"policy", "cursor", "engine", "learner"})
        adaptive = self.setup.aggregation().adaptive
        learnt = GrpcLearner.read_counted_state(c["learner"], adaptive)
        policy.load_state_dict(c["policy"])
        cursor.load_state_dict(c["cursor"])
        state.load_state_dict(c["engine"])
        if state.run.rows_done != cursor.rows_done:
            raise ValueError(
                f"state.components: the record says {state.run.rows_done} rows done, the "
                f"cursor {cursor.rows_done}"
            )
        if len(state.run.rounds) != learnt[3]:
            raise ValueError(
                f"state.components: {len(state.run.rounds)} rounds recorded, the learner "
                f"trained {learnt[3]}"
            )
        if learner is not None:
            learner.load_state_dict(c["learner"])

    def _fresh(
        self, sites: tuple[ElasticSite, ...]
    ) -> tuple[SelectionPolicy, ShardCursor, ElasticState]:
        """The policy, the cursor and the engine's state of this run before its first round
        (the initial model not yet evaluated)."""
        context = PolicyContext.for_curtailment(self.config, self.rounds)
        policy = build_policy(self.policy_name, context)
        cursor = ShardCursor(len(self.setup.data.y_train), self.config.num_shards)
        run = ElasticRun(policy.name, sites, cursor.total_rows)
        return policy, cursor, ElasticState(run, policy_rng(self.config.seed, policy))

    def _check_components(self, components: Mapping[str, Any]) -> None:
        """``_restore`` into throwaway objects of this run's configuration."""
        sites = tuple(ElasticSite(site_id(i), "") for i in range(self.num_sites))
        self._restore(components, *self._fresh(sites), None)

    def _resume_status(self, run: ElasticRun, round_index: int, state: ElasticState) -> None:
        """The status of a run resumed after ``round_index``: its rounds from the record."""
        rows = [
            StatusRound(self._record(r), r.start_s, tuple(w.steps for w in r.work))
            for r in run.rounds
        ]
        self._restore_status(rows, round_index, state.accuracy, state.t)
        if self.target is not None:
            reached = run.time_to(self.target)
            if reached is not None:
                with self._lock:
                    self.status.time_to_accuracy_s = reached
                metrics.TIME_TO_ACCURACY.set(reached)
        metrics.ROUND_CURRENT.set(round_index)
        metrics.ACCURACY.set(state.accuracy)
        metrics.LOSS.set(state.loss)
        metrics.CLOCK.set(state.t)

    # -- pieces ----------------------------------------------------------------------------
    def _report(
        self, engine: ElasticEngine, run: ElasticRun, trace: CarbonTrace, until_s: float
    ) -> EnergyReport:
        """Energy and emissions so far, the study's way (``emissions.account``), into metrics
        and status; per-site counters advance by what is new since the last report."""
        threshold = self.config.threshold
        logs = engine.power_logs(run, until_s)
        for log in logs:
            rep = account([log], trace, threshold)
            kwh, grams = rep.energy_kwh, rep.emissions_kg * 1000.0
            old_kwh, old_g = self._reported.get(log.site, (0.0, 0.0))
            metrics.ENERGY.labels(log.site).inc(max(kwh - old_kwh, 0.0) * metrics.JOULES_PER_KWH)
            metrics.EMISSIONS.labels(log.site).inc(max(grams - old_g, 0.0))
            self._reported[log.site] = (max(kwh, old_kwh), max(grams, old_g))
        return account(logs, trace, threshold)

    # -- lifecycle -------------------------------------------------------------------------
    def _train(self) -> None:
        availability, _, trace = self.feed.availability()
        sites = build_sites(self.config, trace)
        regions = [a.region for a in availability]
        if [s.region for s in sites] != regions:
            raise RuntimeError(
                f"the profiler's site regions {regions} differ from this run's "
                f"{[s.region for s in sites]}: set the same POWERTRIP_REGIONS for both"
            )
        sites = tuple(replace(s, name=site_id(i)) for i, s in enumerate(sites))
        self._begin_training()
        engine = build_engine(
            self.config, sites, tuple(availability), self.rounds, trace, self.config.hours * 3600
        )
        policy, cursor, state = self._fresh(sites)
        ckpt = self._resume
        if ckpt is not None:  # checked by the loader's ``fits``: this cannot fail half-way
            self._restore(ckpt.state["components"], policy, cursor, state, self.learner)
            self._resume_status(state.run, ckpt.round, state)
            self.served.publish(
                to_numpy(self.learner.params), ckpt.round, state.accuracy, state.loss
            )
            self._report(engine, state.run, trace, state.t)
        else:
            state = engine.start(policy, self.learner, cursor, self.config.seed)
        self._pacer.restart(state.t)  # a resumed run paces on from its clock
        logger.info(
            "curtailment run: %d sites (%s), %s, policy %s, step %.2f s",
            len(sites),
            ", ".join(regions),
            trace.label,
            policy.name,
            self.rounds.step_s,
        )

        def on_round(run: ElasticRun) -> None:
            if self._stop.is_set():
                raise RuntimeError("stopped")
            self._on_round(engine, run, trace)
            params = to_numpy(self.learner.params)  # replaced by a round, never written into
            r = run.rounds[-1]
            if not r.failed:  # a failed round left the model as it was
                self.served.publish(params, r.index, r.accuracy, r.loss)
            if self._writer is not None:  # written while the next round trains
                self._writer.submit(
                    len(run.rounds),
                    params,
                    {
                        "run": self.run_id,
                        "clock_s": state.t,
                        "accuracy": state.accuracy,
                        "policy": self.policy_name,
                        "components": self.checkpoint_components(policy, cursor, state),
                    },
                    None if self.learner.outer is None else self.learner.outer.state,
                )
            self._pace(run.rounds[-1].end_s)

        try:
            run = engine.run(policy, self.learner, cursor, self.config.seed, on_round, state)
        except TooManyFailedRounds as exc:
            self._fail(str(exc))
            return
        finally:  # the last checkpoint is durable before the run ends, however it ends
            if self._writer is not None:
                self._writer.wait()
            self.served.write(self._checkpoints)  # however the rounds ended: the last model
        report = account(run.power_logs, trace, self.config.threshold)
        self._report(engine, run, trace, run.end_s)
        metrics.MODE.set(MODE_VALUE["pause"])
        metrics.ACTIVE_SITES.set(0)
        metrics.CLOCK.set(run.end_s)
        self._finish(
            f"{'data used up' if run.finished else 'horizon reached'} at "
            f"{run.end_s / 3600:.2f} h: {report.energy_kwh:.2f} kWh, "
            f"{report.emissions_kg:.3f} kg CO2, {report.curtailed_share:.0%} curtailed",
            clock_s=run.end_s,
            energy=report,
        )

    @staticmethod
    def _record(r: ElasticRound) -> RoundRecord:
        return RoundRecord(
            round=r.index,
            time_s=r.end_s,
            duration_s=r.end_s - r.start_s,
            sites=len(r.work),
            accuracy=r.accuracy,
            loss=r.loss,
            selected=r.participants,
            contributions=len(r.contributors),
            outcome="failed" if r.failed else "completed",
        )

    def _on_round(self, engine: ElasticEngine, run: ElasticRun, trace: CarbonTrace) -> None:
        r = run.rounds[-1]
        active = len(r.contributors)
        mode = "federated" if active >= 2 else "solo" if active == 1 else "pause"
        report = self._report(engine, run, trace, r.end_s)
        rec = self._record(r)
        steps = tuple(w.steps for w in r.work)
        metrics.ROUNDS.labels(rec.outcome).inc()
        metrics.ROUND_DURATION.labels(self.policy_name).observe(rec.duration_s)
        metrics.ROUND_CURRENT.set(r.index)
        metrics.SITES_SELECTED.set(len(r.work))
        for s in r.participants:
            metrics.SITE_SELECTED.labels(site_id(s)).inc()
        metrics.ACCURACY.set(r.accuracy)
        metrics.LOSS.set(r.loss)
        metrics.CLOCK.set(r.end_s)
        metrics.MODE.set(MODE_VALUE[mode])
        metrics.ACTIVE_SITES.set(active)
        reached_at = run.time_to(self.target) if self.target is not None else None
        row = StatusRound(rec, start_s=r.start_s, steps=steps)
        self._record_round(row, reached_at, mode=mode, active_sites=active, energy=report)
        logger.info(
            "round %d: %s, sites %s, steps %s, accuracy %.4f, clock %.0f s, %.2f kWh, %.3f kg%s",
            r.index,
            mode,
            [site_id(s) for s in r.participants],
            list(steps),
            r.accuracy,
            r.end_s,
            report.energy_kwh,
            report.emissions_kg,
            " (failed: no update arrived)" if r.failed else "",
        )
        self._failed_in_a_row = self._failed_in_a_row + 1 if r.failed else 0
        if r.failed:
            metrics.ROUND_FAILURES.labels("no_update").inc()
        if self._failed_in_a_row >= self.cfg.max_failed_rounds:
            raise TooManyFailedRounds(
                f"{self._failed_in_a_row} rounds in a row without any update (no_update)"
            )
