"""A curtailment study: PowerTrip, curtailment-only and the two combined on one set of sites
and one data budget, next to the always-on baselines of spec §5.7.

| run | which sites may train | who trains in a round |
|---|---|---|
| ``powertrip`` | every site, always on | Algorithm 1 over Eq. 8 |
| ``curtailment`` | curtailed sites (§5.2) | all of them |
| ``combined`` | curtailed sites | Algorithm 1 over Eq. 8 + carbon term |
| ``always-on-fl`` | the first ``always_on_sites`` sites, always on | all of them |
| ``single-site`` | one full-power site, always on | it; its energy is priced in every region |

Every run trains the same model from the same start on the same data stream until the stream
is used up (or the observation period ends), with wall-clock rounds and work-weighted FedAvg.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from powertrip.curtailment.availability import (
    AvailabilityRule,
    SiteAvailability,
    always_available,
    availability_from_trace,
)
from powertrip.curtailment.carbon_greedy import WallClockGreedy
from powertrip.curtailment.config import CurtailmentConfig
from powertrip.curtailment.cursor import ShardCursor
from powertrip.curtailment.emissions import EnergyReport, account
from powertrip.curtailment.engine import ElasticEngine, ElasticRun, ElasticSite
from powertrip.curtailment.learner import StreamLearner
from powertrip.curtailment.sites import build_sites, load_carbon
from powertrip.curtailment.wall_clock import WallClockRounds
from powertrip.experiment import MODEL_FOR_WORKLOAD, WORKLOAD_DEFAULTS
from powertrip.learning.datasets import Dataset
from powertrip.learning.federation import load_workload
from powertrip.learning.models import build_model
from powertrip.learning.trainer import LocalTrainingConfig, SiteTrainer, get_params, resolve_device
from powertrip.outer_step import NesterovOuter
from powertrip.selection.base import SelectAll, SelectionPolicy
from powertrip.traces.carbon import CarbonTrace

Progress = Callable[[int, int, str], None]


@dataclass
class PolicyResult:
    name: str
    availability: str  # "curtailed" or "always-on"
    run: ElasticRun
    energy: EnergyReport


@dataclass
class CurtailmentStudy:
    config: CurtailmentConfig
    trace: CarbonTrace
    sites: tuple[ElasticSite, ...]
    availability: tuple[SiteAvailability, ...]  # curtailed availability of the sites
    rounds: WallClockRounds
    total_rows: int
    results: dict[str, PolicyResult] = field(default_factory=dict)
    single_site: dict[str, EnergyReport] = field(default_factory=dict)  # by region
    target_accuracy: float = 0.0
    wall_seconds: float = 0.0

    def emissions_ratios(self, name: str) -> dict[str, float | None]:
        """A run's emissions over the always-on single site's, per region (spec §5.8); None
        where the baseline emitted nothing."""
        mine = self.results[name].energy.emissions_kg
        return {
            r: mine / e.emissions_kg if e.emissions_kg > 0 else None
            for r, e in self.single_site.items()
        }


class StreamSetup:
    """Everything a run's learner needs, built once per study (same init, same stream); the
    aggregator and the workers of the curtailment service build it the same way, so they share
    the model, the trainer settings, the data order and the evaluation set with the emulator."""

    def __init__(self, cfg: CurtailmentConfig, data: Dataset) -> None:
        torch.manual_seed(cfg.seed)
        model = build_model(
            MODEL_FOR_WORKLOAD[cfg.workload],
            num_classes=data.num_classes,
            in_shape=tuple(data.x_train.shape[1:]),
            vocab_size=data.num_classes if data.task == "next-char" else None,
        )
        lr = cfg.lr if cfg.lr is not None else WORKLOAD_DEFAULTS[cfg.workload]["lr"]
        self.trainer = SiteTrainer(
            model,
            LocalTrainingConfig(lr=lr, batch_size=cfg.batch_size, shuffle=False),
            device=resolve_device(),
        )
        self.params = get_params(model)
        self.data = data
        self.order = np.random.default_rng([cfg.seed, 2]).permutation(len(data.y_train))
        self.cfg = cfg

    @classmethod
    def load(cls, cfg: CurtailmentConfig) -> StreamSetup:
        """With the run's workload loaded: how the services build it."""
        return cls(cfg, load_workload(cfg, seed=cfg.seed))  # type: ignore[arg-type]  (same fields)

    def learner(self) -> StreamLearner:
        outer = self.outer()
        d = self.data
        x_test, y_test = self.eval_set
        return StreamLearner(
            self.trainer, d.x_train, d.y_train, x_test, y_test, self.order, self.params, outer
        )

    @property
    def eval_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        d, n = self.data, self.cfg.eval_samples
        return (d.x_test, d.y_test) if n is None else (d.x_test[:n], d.y_test[:n])

    def outer(self) -> NesterovOuter | None:
        if self.cfg.outer == "nesterov":
            return NesterovOuter(self.cfg.outer_lr, self.cfg.outer_momentum)
        return None

    def wall_clock_rounds(self) -> WallClockRounds:
        """The run's round timing: one full-power site needs ``single_site_hours`` in all."""
        cfg = self.cfg
        steps = math.ceil(len(self.data.y_train) / cfg.batch_size)
        return WallClockRounds(
            cfg.single_site_hours * 3600.0 / steps, cfg.round_min_s, cfg.overhead_s
        )


def build_policy(name: str, cfg: CurtailmentConfig, rounds: WallClockRounds) -> SelectionPolicy:
    """Who trains in a round: every connected site (curtailment), or Algorithm 1 (with the
    carbon term for combined)."""
    if name == "curtailment":
        return SelectAll()
    if name == "combined":
        return WallClockGreedy(rounds, cfg.carbon_weight, name="combined")
    return WallClockGreedy(rounds, 0.0, name=name)


def build_engine(
    cfg: CurtailmentConfig,
    sites: tuple[ElasticSite, ...],
    availability: tuple[SiteAvailability, ...],
    rounds: WallClockRounds,
    trace: CarbonTrace,
    horizon_s: float,
) -> ElasticEngine:
    return ElasticEngine(
        sites,
        availability,
        rounds,
        cfg.batch_size,
        horizon_s,
        carbon=trace,
        update_bytes=cfg.update_gb * 1e9,
        eval_every_s=cfg.eval_every_s,
    )


def run_curtailment_study(cfg: CurtailmentConfig, progress: Progress | None = None):
    started = time.perf_counter()
    trace = load_carbon(cfg)
    sites = build_sites(cfg, trace)
    rule = AvailabilityRule(cfg.threshold, cfg.hold_s, cfg.provisioning_s)
    pairs = [(s.name, s.region) for s in sites]
    curtailed = tuple(availability_from_trace(trace, pairs, rule))
    data = load_workload(cfg, seed=cfg.seed)  # type: ignore[arg-type]  (same fields)
    learning = StreamSetup(cfg, data)
    total_rows = len(data.y_train)
    if cfg.num_shards > total_rows:
        raise ValueError(f"--shards: {cfg.num_shards} shards for {total_rows} training samples")
    rounds = learning.wall_clock_rounds()
    study = CurtailmentStudy(cfg, trace, sites, curtailed, rounds, total_rows)

    plan: list[tuple[str, str, tuple[ElasticSite, ...], SelectionPolicy]] = []
    for name in cfg.policies:
        kind = "always-on" if name == "powertrip" else "curtailed"
        plan.append((name, kind, sites, build_policy(name, cfg, rounds)))
    plan.append(("always-on-fl", "always-on", sites[: cfg.always_on_sites], SelectAll()))
    single = replace(sites[0], power=1.0, comm_s=0.0, train_kw=cfg.train_kw)
    plan.append(("single-site", "always-on", (single,), SelectAll()))

    for done, (name, kind, members, policy) in enumerate(plan):
        if progress is not None:
            progress(done, len(plan), name)
        if kind == "curtailed":
            avail = tuple(curtailed[sites.index(s)] for s in members)
            horizon = cfg.hours * 3600.0
        else:
            avail = tuple(always_available([(s.name, s.region) for s in members]))
            horizon = math.inf  # always-on runs finish; the trace is held flat past its end
        engine = build_engine(cfg, members, avail, rounds, trace, horizon)
        cursor = ShardCursor(total_rows, cfg.num_shards)
        run = engine.run(policy, learning.learner(), cursor, cfg.seed)
        run.policy = name
        energy = account(run.power_logs, trace, cfg.threshold)
        study.results[name] = PolicyResult(name, kind, run, energy)
        if name == "single-site":
            for region in trace.regions:
                logs = [replace(log, region=region) for log in run.power_logs]
                study.single_site[region] = account(logs, trace, cfg.threshold)
    if progress is not None:
        progress(len(plan), len(plan), "done")

    best = [r.run.best_accuracy for r in study.results.values()]
    study.target_accuracy = cfg.target_accuracy if cfg.target_accuracy is not None else min(best)
    study.wall_seconds = time.perf_counter() - started
    return study
