"""Policy names -> configured policies: the one place the CLI, the emulator and the aggregator
service turn a name like ``powertrip`` or ``static-40`` into a ``SelectionPolicy``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from powertrip.config.footprint import FootprintSettings
from powertrip.config.sites import RoundTimeModel
from powertrip.selection.base import (
    Centralized,
    FixedRadius,
    RandomK,
    RankingConfig,
    SelectAll,
    SelectionPolicy,
    StaticTopK,
)
from powertrip.selection.forecast_greedy import ForecastGreedy
from powertrip.selection.greedy import GainModel, GreedyConfig, PowerTripGreedy, SearchMode
from powertrip.selection.joint import JointGreedy
from powertrip.selection.scoring import Estimator, Ranking

#: The paper's Algorithm 1 as reconstructed here (Eq. 8 ranking, log gain, mean-power estimate).
PAPER_GREEDY = GreedyConfig()

#: The project's previous default (``powertrip-noise``): rank by each site's own round time,
#: project gains with the measured update noise scale B = tr(Sigma)/|G|^2, estimate the round by
#: its true straggler.
NOISE_GREEDY = GreedyConfig(
    gain=GainModel.NOISE_SCALE,
    estimator=Estimator.MAX,
    ranking=RankingConfig(ranking=Ranking.ROUND_TIME),
)

#: The project's default (docs/reproduction.md §5): the same, with the noise scale measured along
#: the direction the model moves (the projections of the updates on the last global delta).
#: Two sites at least: one site measures no dispersion, so its noise scale would freeze.
#: k0 and the window are the paper's at up to 100 sites and grow in proportion beyond
#: (docs/scale.md: at 150 sites a ramp of 5 sites a round from 10 missed the target).
PROJECT_GREEDY = replace(
    NOISE_GREEDY, gain=GainModel.NOISE_DIRECTIONAL, min_sites=2, reference_sites=100
)

VARIANTS: dict[str, GreedyConfig] = {
    "powertrip": PROJECT_GREEDY,
    "powertrip-paper": PAPER_GREEDY,
    "powertrip-noise": NOISE_GREEDY,
    "powertrip-directional": PROJECT_GREEDY,
    "powertrip-split": replace(NOISE_GREEDY, gain=GainModel.SPLIT_HALF, min_sites=2),
    "powertrip-split-acc": replace(NOISE_GREEDY, gain=GainModel.SPLIT_HALF_ACCURACY, min_sites=2),
    "powertrip-prefix": replace(PAPER_GREEDY, search=SearchMode.INCREMENTAL_PREFIX),
    "powertrip-kappa": replace(PAPER_GREEDY, gain=GainModel.KAPPA_HEADROOM),
    "powertrip-maxest": replace(PAPER_GREEDY, estimator=Estimator.MAX),
    "highest-power": replace(PAPER_GREEDY, ranking=RankingConfig(ranking=Ranking.POWER)),
    "lowest-latency": replace(PAPER_GREEDY, ranking=RankingConfig(ranking=Ranking.LATENCY)),
}

#: baseline selectors from the literature (docs/selectors.md): name -> module, class
LITERATURE = ("oort", "ecolearn", "fedzero")

# -- forecast-aware PowerTrip (powertrip/selection/forecast_greedy.py, docs/forecasts.md): the
# project's default over the forecast mean power of the round; PowerTrip itself without one.
FORECAST_VARIANTS: dict[str, GreedyConfig] = {"powertrip-forecast": PROJECT_GREEDY}
VARIANTS.update(FORECAST_VARIANTS)
# -- the joint objective (powertrip/selection/joint.py, docs/joint-objective.md): the default
# weighing emissions and electricity cost against time, on the study's grid (FootprintSettings).
# Trading time for footprint runs few sites, so it keeps to the run's round budget (3 decisions
# in a row behind the target's pace grow k; docs/joint-objective.md).
JOINT_VARIANTS: dict[str, GreedyConfig] = {
    "powertrip-joint": replace(PROJECT_GREEDY, round_budget=3)
}
VARIANTS.update(JOINT_VARIANTS)

SIMPLE = ("select-all", "fixed-radius", "random", "centralized-25", "centralized-50")
NEEDS_K_STAR = ("static-optimal", "random")
_STATIC = re.compile(r"static-([1-9]\d*)")


def known_policy_names() -> list[str]:
    return [*VARIANTS, "static-optimal", "static-<k>", *SIMPLE, *LITERATURE]


def validate_policy_name(name: str) -> str:
    if name in VARIANTS or name in SIMPLE or name in LITERATURE or name == "static-optimal":
        return name
    if _STATIC.fullmatch(name):
        return name
    raise ValueError(f"unknown policy {name!r}; known policies: {', '.join(known_policy_names())}")


def build_policy(
    name: str,
    *,
    k_star: int | None = None,
    greedy_overrides: Mapping[str, Any] | None = None,
    radius_mi: float = 1000.0,
    round_time_model: RoundTimeModel = RoundTimeModel.PER_SITE_MAX,
    footprint: FootprintSettings | None = None,
) -> SelectionPolicy:
    """A fresh policy instance (policies keep per-run state, so never share one across runs).

    The project's variants estimate a round with the system's own time model: the straggler
    max for synchronous per-site rounds, Eq. 7 when work is spread over the sites' power.
    The paper's variants keep Algorithm 1's mean-power estimate whatever the system.
    ``footprint``: the grid and weights ``powertrip-joint`` prices (its defaults when None).
    ``greedy_overrides``: ``GreedyConfig`` fields (``GreedyParams.overrides``), checked by it.
    """
    validate_policy_name(name)
    if name in VARIANTS:
        cfg = VARIANTS[name]
        if cfg.estimator is Estimator.MAX and round_time_model is RoundTimeModel.AGGREGATE:
            cfg = replace(cfg, estimator=Estimator.AGGREGATE)
        cfg = replace(cfg, **(greedy_overrides or {}))
        if name in FORECAST_VARIANTS:
            return ForecastGreedy(cfg, name=name)
        if name in JOINT_VARIANTS:
            return JointGreedy(cfg, footprint, name=name)
        return PowerTripGreedy(cfg, name=name)
    if m := _STATIC.fullmatch(name):
        return StaticTopK(int(m.group(1)))
    if name in NEEDS_K_STAR:
        if k_star is None:
            raise ValueError(f"policy {name!r} needs k* from a static sweep")
        return (
            StaticTopK(k_star, name="static-optimal")
            if name == "static-optimal"
            else RandomK(k_star)
        )
    if name in LITERATURE:
        return literature_policy(name)
    if name == "select-all":
        return SelectAll()
    if name == "fixed-radius":
        return FixedRadius(radius_mi)
    return Centralized(int(name.rsplit("-", 1)[1]) / 100)


def literature_policy(name: str) -> SelectionPolicy:
    """Oort, EcoLearn or FedZero with their papers' defaults (imported lazily: FedZero's MIP
    needs scipy, which only these baselines use)."""
    if name == "oort":
        from powertrip.selection.oort import Oort

        return Oort()
    if name == "ecolearn":
        from powertrip.selection.ecolearn import EcoLearn

        return EcoLearn()
    from powertrip.selection.fedzero import FedZero

    return FedZero()
