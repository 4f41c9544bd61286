"""The aggregator's curtailment mode, the curtailment-aware elastic training of
docs/curtailment.md: the emulator's ``ElasticEngine`` plays the run on an emulated clock, with
availability and the carbon trace from the profiler's ``GetAvailability`` and the training done
by the workers (``GrpcLearner``).

The scheduling, the data cursor, the round arithmetic and the energy accounting are the
emulator's own code, so a service run makes the decisions and reports the energy and emissions
of ``powertrip curtail``'s curtailment run for the same settings. Not resumable: a restarted
aggregator starts the run again (no checkpoints in this mode).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from powertrip.curtailment.cursor import ShardCursor
from powertrip.curtailment.emissions import EnergyReport, account
from powertrip.curtailment.engine import ElasticEngine, ElasticRun
from powertrip.curtailment.learner import Evaluate, FoldingLearner
from powertrip.curtailment.sites import build_sites
from powertrip.learning.device import TorchParams, to_numpy, to_torch
from powertrip.learning.federation import StreamSetup
from powertrip.learning.tokenizer_settings import with_tokenizer_hash
from powertrip.outer_step import NesterovOuter
from powertrip.robust import Aggregation
from powertrip.rounds import RoundRecord
from powertrip.services.aggregator import metrics
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.delta_inbox import DeltaInbox
from powertrip.services.aggregator.executor import GrpcRoundExecutor
from powertrip.services.aggregator.lifecycle import Registration, RunLifecycle
from powertrip.services.aggregator.profile_feed import ProfileFeed
from powertrip.services.aggregator.run_status import StatusRound
from powertrip.sites import site_id
from powertrip.study.curtailment import build_engine, build_policy
from powertrip.traces.carbon import CarbonTrace
from powertrip.v1 import common_pb2

logger = logging.getLogger(__name__)

MODE_VALUE = {"pause": 0, "solo": 1, "federated": 2}


class GrpcLearner(FoldingLearner):
    """``FoldingLearner`` over the workers: each ``train_sites`` call is one sub-round in which
    the named sites train their stream rows from the given model on their workers."""

    def __init__(
        self,
        transport: GrpcRoundExecutor,
        params: TorchParams,
        evaluate: Evaluate,
        batch_size: int,
        run_seed: int,
        deadline_s: float,
        outer: NesterovOuter | None = None,
        aggregation: Aggregation | None = None,
    ) -> None:
        super().__init__(params, evaluate, batch_size, outer, aggregation)
        self.transport = transport
        self.run_seed = run_seed
        self.deadline_s = deadline_s
        self.sub_rounds = 0

    def train_sites(
        self, params: TorchParams, sites: Sequence[int], rows: Sequence[NDArray[np.int64]]
    ) -> list[TorchParams]:
        self.sub_rounds += 1
        n = self.sub_rounds
        arrays = to_numpy(params)
        given = {s: math.ceil(len(r) / self.batch_size) for s, r in zip(sites, rows, strict=True)}
        inbox = DeltaInbox(n, sites, given)  # a site's weight is at most the steps it was given
        tx = self.transport
        tx.params, tx.collector = arrays, inbox  # the servicer checks updates against these
        by_site = dict(zip(sites, rows, strict=True))
        groups, orphans = tx.registry.group(list(sites))
        for s in orphans:
            inbox.fail(s, "unhosted")
        for worker_id, hosted in groups.items():
            spec = common_pb2.RoundSpec(
                round=n,
                run_seed=self.run_seed,
                site_ids=[site_id(s) for s in hosted],
                deadline_seconds=self.deadline_s,
                stream_rows={
                    site_id(s): common_pb2.StreamRows(positions=by_site[s].tolist()) for s in hosted
                },
            )
            tx.send_round(inbox, worker_id, hosted, spec, arrays)
        inbox.wait(self.deadline_s)
        inbox.close()
        tx.release_broadcast()  # the sub-round's encoded model (one copy) is no longer needed
        if inbox.failed:
            why = ", ".join(f"{site_id(s)}: {r}" for s, r in sorted(inbox.failed.items()))
            raise RuntimeError(f"sub-round {n}: no update from {why}")
        for s, r in by_site.items():
            steps = math.ceil(len(r) / self.batch_size)
            if inbox.weights[s] != steps:
                raise RuntimeError(
                    f"{site_id(s)} reported {inbox.weights[s]:g} steps for {len(r)} rows, "
                    f"expected {steps}"
                )
        return [to_torch(inbox.deltas[s]) for s in sites]


class CurtailmentRun(RunLifecycle):
    """Curtailment mode: the elastic engine's run, each sub-round trained on the workers."""

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
        x_test, y_test = self.setup.eval_set
        trainer = self.setup.trainer
        params = to_numpy(self.setup.params, copy=True)

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
            self.setup.params,
            evaluate,
            self.config.batch_size,
            self.run_seed,
            cfg.round_deadline_s,
            self.setup.outer(),
            self.setup.aggregation(),
        )
        self.feed = ProfileFeed(cfg, num_sites)
        self._reported: dict[str, tuple[float, float]] = {}  # site -> (kWh, g) already counted

    @property
    def policy_name(self) -> str:
        return self.cfg.curtail_policy

    def registration(self) -> Registration:
        return Registration(
            self.run_seed, self.mode, curtail_config_json=self.config.model_dump_json()
        )

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
        rounds = self.setup.wall_clock_rounds()
        engine = build_engine(
            self.config, sites, tuple(availability), rounds, trace, self.config.hours * 3600
        )
        policy = build_policy(self.policy_name, self.config, rounds)
        cursor = ShardCursor(len(self.setup.data.y_train), self.config.num_shards)
        logger.info(
            "curtailment run: %d sites (%s), %s, policy %s, step %.2f s",
            len(sites),
            ", ".join(regions),
            trace.label,
            policy.name,
            rounds.step_s,
        )

        def on_round(run: ElasticRun) -> None:
            if self._stop.is_set():
                raise RuntimeError("stopped")
            self._on_round(engine, run, trace)

        run = engine.run(policy, self.learner, cursor, self.config.seed, on_round)
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

    def _on_round(self, engine: ElasticEngine, run: ElasticRun, trace: CarbonTrace) -> None:
        r = run.rounds[-1]
        active = len(r.contributors)
        mode = "federated" if active >= 2 else "solo" if active == 1 else "pause"
        report = self._report(engine, run, trace, r.end_s)
        rec = RoundRecord(
            round=r.index,
            time_s=r.end_s,
            duration_s=r.end_s - r.start_s,
            sites=len(r.work),
            accuracy=r.accuracy,
            loss=r.loss,
            selected=r.participants,
            contributions=active,
        )
        steps = tuple(w.steps for w in r.work)
        metrics.ROUNDS.labels("completed").inc()
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
            "round %d: %s, sites %s, steps %s, accuracy %.4f, clock %.0f s, %.2f kWh, %.3f kg",
            r.index,
            mode,
            [site_id(s) for s in r.participants],
            list(steps),
            r.accuracy,
            r.end_s,
            report.energy_kwh,
            report.emissions_kg,
        )
        self._pace(r.end_s)
