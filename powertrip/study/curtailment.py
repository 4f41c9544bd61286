"""A curtailment study: PowerTrip, curtailment-only and the two combined on one set of sites
and one data budget, next to the always-on baselines of the curtailment paper (arXiv 2602.22760).

| run | which sites may train | who trains in a round |
|---|---|---|
| ``powertrip`` | every site, always on | Algorithm 1 over Eq. 8 |
| ``curtailment`` | curtailed sites | all of them |
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

import torch
from numpy.typing import NDArray

from powertrip.config.curtailment import CurtailmentConfig
from powertrip.curtailment.availability import (
    AvailabilityRule,
    SiteAvailability,
    always_available,
    availability_from_trace,
)
from powertrip.curtailment.cursor import ShardCursor
from powertrip.curtailment.emissions import EnergyReport, account
from powertrip.curtailment.engine import ElasticEngine
from powertrip.curtailment.run_model import ElasticRun, ElasticSite
from powertrip.curtailment.sites import build_sites, load_carbon
from powertrip.curtailment.wall_clock import WallClockRounds
from powertrip.federation import StreamSetup, load_workload
from powertrip.learning.model_file import final_state
from powertrip.selection.base import SelectAll, SelectionPolicy
from powertrip.selection.registry import PolicyContext, build_policy
from powertrip.study.curtailment_record import elastic_run_from_json, elastic_run_json
from powertrip.study.record import StudyRecord
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
        """A run's emissions over the always-on single site's, per region (the paper's headline
        ratio); None where the baseline emitted nothing."""
        mine = self.results[name].energy.emissions_kg
        return {
            r: mine / e.emissions_kg if e.emissions_kg > 0 else None
            for r, e in self.single_site.items()
        }


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


def run_curtailment_study(
    cfg: CurtailmentConfig,
    progress: Progress | None = None,
    device: torch.device | str = "auto",
    on_round: Callable[[str, ElasticRun], None] | None = None,
    record: StudyRecord | None = None,
    on_model: Callable[[str, ElasticRun, dict[str, NDArray]], None] | None = None,
):
    """Every policy and baseline of ``cfg``; ``device`` is where the sites train (an execution
    setting, not part of ``cfg``). ``progress(done, total, name)`` as each run starts and once
    at the end; ``on_round(name, run)`` after each round of every run (runs are sequential).
    ``record``: each run is recorded there as it finishes, and a run it holds is read back
    instead of run again (a resumed study: every run starts from the same model and stream, so
    none depends on another). ``on_model(name, run, state)``: each run's final model (its
    ``state_dict`` as host arrays) as the run finishes; a run read back has none."""
    started = time.perf_counter()
    trace = load_carbon(cfg)
    sites = build_sites(cfg, trace)
    rule = AvailabilityRule(cfg.threshold, cfg.hold_s, cfg.provisioning_s)
    pairs = [(s.name, s.region) for s in sites]
    curtailed = tuple(availability_from_trace(trace, pairs, rule))
    data = load_workload(cfg, seed=cfg.seed)
    learning = StreamSetup(cfg, data, device)
    total_rows = len(data.y_train)
    if cfg.num_shards > total_rows:
        raise ValueError(f"--shards: {cfg.num_shards} shards for {total_rows} training samples")
    rounds = learning.wall_clock_rounds()
    study = CurtailmentStudy(cfg, trace, sites, curtailed, rounds, total_rows)

    plan: list[tuple[str, str, tuple[ElasticSite, ...], SelectionPolicy]] = []
    context = PolicyContext.for_curtailment(cfg, rounds)
    for name in cfg.policies:
        kind = "always-on" if name == "powertrip" else "curtailed"
        plan.append((name, kind, sites, build_policy(name, context)))
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
        kept = None if record is None else record.get(name)
        if kept is not None:
            run = elastic_run_from_json(kept, name, members, total_rows)
        else:
            engine = build_engine(cfg, members, avail, rounds, trace, horizon)
            cursor = ShardCursor(total_rows, cfg.num_shards)
            each = None if on_round is None else (lambda r, name=name: on_round(name, r))
            learner = learning.learner()
            run = engine.run(policy, learner, cursor, cfg.seed, on_round=each)
            run.policy = name
            if on_model is not None:
                on_model(name, run, final_state(learning.trainer.model, learner.params))
            if record is not None:
                record.add(name, elastic_run_json(run))
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
