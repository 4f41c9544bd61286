"""A study: every requested policy x repeat on one fixed set of sites, scored by the paper's
time-to-accuracy.

Phase 1 runs the static sweep (the learning curves of top-k for each k); it fixes the target
accuracy when none is given (the paper's rule: the lowest best accuracy any k reaches) and k*
(lowest mean time-to-accuracy over repeats). Phase 2 runs every other policy. The site profile
seed stays fixed; the training seed (data partition, model init, batch order) is ``seed + repeat``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import torch

from powertrip.aggregation.robust import Aggregation
from powertrip.codecs import get_codec
from powertrip.config.experiment import ExperimentConfig
from powertrip.federation import build_federation, load_workload
from powertrip.footprint import Footprint, FootprintModel
from powertrip.learning.lm_eval import validation_bytes
from powertrip.rounds.emulate import (
    EmulatedRun,
    Emulator,
    RoundRecord,
    RunResult,
    TimeModel,
    TrajectoryCache,
)
from powertrip.selection.base import StaticTopK
from powertrip.selection.registry import PolicyContext, build_policy, validate_policy_name
from powertrip.sites.forecast import build_forecaster
from powertrip.sites.grid import SiteGrid
from powertrip.sites.power_model import UNIFORM_LABEL, build_power
from powertrip.sites.profiles import ModelledLinks, PowerSource, SiteSet, generate_sites

#: progress hook: (finished runs, total runs, label of the run in progress)
Progress = Callable[[int, int, str], None]


@dataclass
class RunSummary:
    policy: str
    repeat: int
    seed: int
    time_to_accuracy_s: float | None
    rounds: int | None  # rounds to target, or None if never reached
    rounds_run: int
    mean_sites: float
    max_sites: int
    final_accuracy: float
    best_accuracy: float
    #: the rounds counted for time to accuracy (all of them when missed), priced on the study's
    #: grid (powertrip.footprint); None for the centralized baselines, which have no grid
    footprint: Footprint | None = None

    @property
    def reached(self) -> bool:
        return self.time_to_accuracy_s is not None


@dataclass
class StudyResult:
    config: ExperimentConfig
    sites: SiteSet
    target_accuracy: float
    k_star: int | None
    runs: list[tuple[int, RunResult]] = field(default_factory=list)  # (repeat, run)
    summaries: list[RunSummary] = field(default_factory=list)
    wall_seconds: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    power_label: str = UNIFORM_LABEL  # "synthetic-trace" must reach every output
    #: an LM's (validation tokens, bytes they spell): its losses as bits per byte (lm_eval)
    lm_validation: tuple[int, int] | None = None

    def model(self, policy: str, repeat: int = 0) -> dict[str, torch.Tensor]:
        """The final global model of ``policy``'s run in ``repeat`` as a ``state_dict`` (for
        ``"static-optimal"``: static-k*'s), kept when the study ran with ``keep_models``."""
        name = f"static-{self.k_star}" if policy == "static-optimal" else policy
        for rep, run in self.runs:
            if rep == repeat and run.policy == name:
                model = getattr(run, "model", None)
                if model is None:
                    raise LookupError(
                        f"the model of {policy} (repeat {repeat}) was not kept: run the study "
                        f"with keep_models=True or keep_models={{{policy!r}}}"
                    )
                return model
        raise KeyError(f"the study has no run of {policy!r} in repeat {repeat}")


class RunLog(Protocol):
    """Where a study keeps each run as it finishes, and finds the runs an earlier process of the
    same study finished (``run_log.StudyLog``: the output folder's record and tables)."""

    def recorded(self, repeat: int, policy: str) -> tuple[RunResult, tuple[int, int]] | None:
        """A run finished before: the run and its trajectory-cache (hits, misses); else None."""

    def finished(
        self,
        result: StudyResult,
        repeat: int,
        run: RunResult,
        cache: tuple[int, int],
        computed: bool,
    ) -> None:
        """A run is done (``computed`` here, or read back from ``recorded``)."""

    def scored(self, result: StudyResult, summaries: Sequence[RunSummary]) -> None:
        """Runs' summaries are known (the target and k* they need are fixed)."""


def summarise(
    run: RunResult, repeat: int, target: float, footprint: FootprintModel | None = None
) -> RunSummary:
    rounds = run.rounds
    upto = run.rounds_to(target)
    used = rounds[:upto] if upto is not None else rounds
    # the centralized baselines (one co-located site) have no grid to price
    priced = None if run.policy.startswith("centralized") else footprint
    return RunSummary(
        policy=run.policy,
        repeat=repeat,
        seed=run.seed,
        time_to_accuracy_s=run.time_to(target),
        rounds=upto,
        rounds_run=len(rounds),
        mean_sites=float(np.mean([r.sites for r in used])) if used else 0.0,
        max_sites=max((r.sites for r in used), default=0),
        final_accuracy=rounds[-1].accuracy if rounds else run.initial_accuracy,
        best_accuracy=max((r.accuracy for r in rounds), default=run.initial_accuracy),
        footprint=priced.rounds(used) if priced is not None else None,
    )


def choose_k_star(summaries: list[RunSummary], sweep: tuple[int, ...]) -> int:
    """k with the lowest mean TTA over repeats; a k that misses the target in any repeat loses
    to one that always reaches it."""

    def cost(k: int) -> tuple[int, float]:
        rows = [s for s in summaries if s.policy == f"static-{k}"]
        reached = [t for s in rows if (t := s.time_to_accuracy_s) is not None]
        missed = len(rows) - len(reached)
        return missed, float(np.mean(reached)) if reached else math.inf

    return min(sweep, key=cost)


def study_sites(cfg: ExperimentConfig) -> tuple[SiteSet, PowerSource, str]:
    """The study's fixed sites and their power over time (and its label): from the site seed
    alone, so a profiler service with the same seed and power model serves the same power."""
    sites = generate_sites(cfg.num_sites, np.random.default_rng(cfg.site_seed), cfg.distance_mode)
    power, label = build_power(cfg, sites)
    return sites, power, label


def wire_update_bytes(cfg: ExperimentConfig, params: Mapping[str, torch.Tensor]) -> float:
    """The update size M the selection prices and the time model charges: ``cfg.update_bytes``
    (fp32) times the codec's exact wire ratio for the model's tensors (docs/compression.md)."""
    if cfg.codec == "none":
        return cfg.update_bytes
    return cfg.update_bytes * get_codec(cfg.codec).ratio(tuple(t.shape) for t in params.values())


def check_registered_names(cfg: ExperimentConfig) -> None:
    """ValueError naming the first policy or codec no registry knows, before any work: the
    configuration holds names, the registries above it resolve them."""
    for name in cfg.policies:
        validate_policy_name(name)
    get_codec(cfg.codec)


def run_study(
    cfg: ExperimentConfig,
    progress: Progress | None = None,
    on_round: Callable[[str, int, RoundRecord], None] | None = None,
    device: torch.device | str = "auto",
    keep_models: bool | Collection[str] = False,
    log: RunLog | None = None,
) -> StudyResult:
    """Every policy x repeat of ``cfg``; ``device`` is where the sites train (an execution
    setting: it is not part of ``cfg``, the run's identity).

    ``progress(done, total, label)`` is called as each run starts and ends; ``on_round(policy,
    repeat, record)`` after each round of every run, in this process (runs are sequential).
    ``keep_models``: which runs keep their final global model for ``StudyResult.model`` (one
    model in memory per kept run): none by default, every run with True, or the runs of the
    policies named (``"static-optimal"`` keeps static-k*'s).
    ``log``: each run is handed to it as it finishes, and a run it ``recorded`` before is read
    back instead of run again (a resumed study). Every run is a function of the configuration
    and its repeat alone (the trajectory cache only saves work), so the study comes out the
    same; a run read back keeps no model."""
    check_registered_names(cfg)
    started = time.perf_counter()
    data = load_workload(cfg, seed=cfg.seed)
    sites, power, power_label = study_sites(cfg)

    sweep = cfg.effective_sweep
    needs_sweep = "static-optimal" in cfg.policies or "random" in cfg.policies
    needs_sweep = needs_sweep or cfg.target_accuracy is None
    sweep = sweep if needs_sweep else ()
    others = [p for p in cfg.policies if p != "static-optimal"]
    total = cfg.repeats * (len(sweep) + len(others))
    done = 0
    # the result from the start (target and k* once the sweep fixes them), for the log's tables
    result = StudyResult(cfg, sites, math.nan, None, power_label=power_label)
    result.lm_validation = validation_bytes(data) if data.task == "lm" else None

    def tick(label: str) -> None:
        if progress is not None:
            progress(done, total, label)

    emulators: list[Emulator] = []
    for rep in range(cfg.repeats):
        seed = cfg.seed + rep
        fed = build_federation(cfg, data, seed, device)
        if rep == 0:  # the update's wire size: the codec's exact bytes for this model's tensors
            update_bytes = wire_update_bytes(cfg, fed.initial_params)
            time_model = TimeModel(
                cfg.ideal_compute_s, update_bytes, cfg.ground_truth, cfg.round_trip
            )
            if cfg.round_power == "integrated":
                time_model = replace(time_model, power=power)
            footprint = FootprintModel(
                power,
                cfg.ideal_compute_s,
                SiteGrid.from_settings(cfg),
                cfg.train_kw,
                cfg.idle_kw,
                integrated=cfg.round_power == "integrated",
            )
        emulators.append(
            Emulator(
                fed,
                sites,
                power,
                ModelledLinks(sites),
                time_model,
                seed,
                TrajectoryCache(),
                Aggregation.of(cfg),
                cfg,  # its outer-step settings
                build_forecaster(cfg.forecast, power, cfg.forecast_error, seed),
                cfg.codec,
                cfg.error_feedback,
                cfg,  # its hostile-site settings
            )
        )

    def run_one(rep: int, policy, target: float | None) -> RunResult:
        nonlocal done
        tick(f"{policy.name} (repeat {rep + 1}/{cfg.repeats})")
        got = None if log is None else log.recorded(rep, policy.name)
        if got is not None:
            run, cache = got
        else:
            hook = None
            if on_round is not None:

                def hook(rec: RoundRecord, name: str = policy.name) -> None:
                    on_round(name, rep, rec)

            em = emulators[rep].cache
            before = em.hits, em.misses
            run = emulators[rep].run(policy, target, cfg.max_rounds, on_round=hook)
            cache = em.hits - before[0], em.misses - before[1]
        if log is not None:  # with its model still on, where it has one
            log.finished(result, rep, run, cache, computed=got is None)
        if isinstance(run, EmulatedRun) and not keeps(run.policy):
            run.model = None  # a big sweep would otherwise hold one model per run
        result.cache_hits += cache[0]
        result.cache_misses += cache[1]
        done += 1
        tick(f"{policy.name} (repeat {rep + 1}/{cfg.repeats})")
        return run

    def keeps(name: str) -> bool:  # every sweep model, until k* says which one static-optimal is
        if isinstance(keep_models, bool):
            return keep_models
        return name in keep_models or (name in sweep_names and "static-optimal" in keep_models)

    sweep_names = {f"static-{k}" for k in sweep}
    # Phase 1: the static sweep (to the full budget when the target comes from it).
    sweep_runs: list[tuple[int, RunResult]] = []
    for rep in range(cfg.repeats):
        for k in sweep:
            sweep_runs.append((rep, run_one(rep, StaticTopK(k), cfg.target_accuracy)))
    if cfg.target_accuracy is not None:
        target = cfg.target_accuracy
    else:
        target = min(max(r.accuracy for r in run.rounds) for _, run in sweep_runs)
    sweep_summaries = [summarise(run, rep, target, footprint) for rep, run in sweep_runs]
    k_star = choose_k_star(sweep_summaries, sweep) if sweep else None
    sweep_names = {f"static-{k_star}"}  # the other sweep runs' models go unless named
    for _, run in sweep_runs:
        if isinstance(run, EmulatedRun) and not keeps(run.policy):
            run.model = None

    result.target_accuracy, result.k_star = target, k_star
    result.runs.extend(sweep_runs)
    result.summaries.extend(sweep_summaries)
    if "static-optimal" in cfg.policies and k_star is not None:
        for rep, run in sweep_runs:
            if run.policy == f"static-{k_star}":
                s = summarise(run, rep, target, footprint)
                s.policy = "static-optimal"
                result.summaries.append(s)
    if log is not None:
        log.scored(result, result.summaries)

    # Phase 2: every other policy.
    context = PolicyContext(
        k_star=k_star,
        greedy_overrides=cfg.greedy.overrides(),
        round_time_model=cfg.ground_truth,
        footprint=cfg,
    )
    for rep in range(cfg.repeats):
        for name in others:
            policy = build_policy(name, context)
            run = run_one(rep, policy, target)
            result.runs.append((rep, run))
            result.summaries.append(summarise(run, rep, target, footprint))
            if log is not None:
                log.scored(result, result.summaries[-1:])

    result.wall_seconds = time.perf_counter() - started
    return result
