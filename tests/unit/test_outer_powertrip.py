"""PowerTrip mode takes the outer step too: configured as in the curtailment study, applied by
``round_outcome`` after the aggregate and before evaluation, in the emulator (whose cache
carries the momentum) and in the aggregator service (POWERTRIP_OUTER*)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from powertrip.aggregation.fedavg import StreamingFedAvg
from powertrip.aggregation.outer_step import NesterovOuter, outer_for
from powertrip.config.curtailment import CurtailmentConfig
from powertrip.config.experiment import build_config
from powertrip.config.sites import RoundTimeModel
from powertrip.federation import build_federation, load_workload
from powertrip.rounds.emulate import Emulator, TimeModel, TrajectoryCache
from powertrip.rounds.outcome import round_outcome
from powertrip.selection.base import SelectAll, StaticTopK
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.common.config import ConfigError, load_config
from powertrip.sites.profiles import ModelledLinks, StaticPower, generate_sites

TINY = {"num_sites": 6, "num_samples": 600, "static_sweep": (3, 6), "ideal_compute_s": 10.0}
MODEL = {"w": np.array([1.0, -2.0, 3.0], np.float32), "b": np.array([0.5], np.float32)}


def folded(*deltas: float) -> StreamingFedAvg:
    agg = StreamingFedAvg(MODEL)
    for d in deltas:
        agg.add({k: np.full_like(v, d) for k, v in MODEL.items()}, 1.0)
    return agg


def test_round_outcome_takes_the_outer_step_after_fedavg_and_evaluates_its_result():
    seen = []
    evaluate = lambda p: (seen.append({k: v.copy() for k, v in p.items()}), (0.5, 1.0))[1]  # noqa: E731
    fedavg = folded(0.1, 0.3).apply(MODEL)
    expected = NesterovOuter(0.7, 0.9).step(MODEL, fedavg)

    outer = NesterovOuter(0.7, 0.9)
    out = round_outcome(folded(0.1, 0.3), MODEL, evaluate, selected=2, outer=outer)

    assert all(np.array_equal(out.params[k], expected[k]) for k in MODEL)
    assert all(np.array_equal(seen[-1][k], expected[k]) for k in MODEL)  # evaluated: the step
    assert out.outer_state is outer.state and out.outer_state is not None
    plain = round_outcome(folded(0.1, 0.3), MODEL, evaluate, selected=2)
    assert all(np.array_equal(plain.params[k], fedavg[k]) for k in MODEL)
    assert plain.outer_state is None


def test_the_split_half_model_takes_the_same_step_without_advancing_the_momentum():
    evaluate = lambda p: (0.5, 1.0)  # noqa: E731
    outer = NesterovOuter(0.7, 0.9)
    out = round_outcome(
        folded(0.1, 0.3),
        MODEL,
        evaluate,
        selected=2,
        half=folded(0.1),
        evaluate_half=False,
        outer=outer,
    )
    half_expected = NesterovOuter(0.7, 0.9).step(MODEL, folded(0.1).apply(MODEL))
    assert all(np.array_equal(out.half_params[k], half_expected[k]) for k in MODEL)
    alone = NesterovOuter(0.7, 0.9)
    alone.step(MODEL, folded(0.1, 0.3).apply(MODEL))
    assert all(np.array_equal(outer.state[k], alone.state[k]) for k in MODEL)


def test_experiment_config_has_the_curtailment_studys_outer_settings_and_checks():
    cfg = build_config("quick")
    assert (cfg.outer, cfg.outer_lr, cfg.outer_momentum) == ("fedavg", 0.7, 0.9)
    assert outer_for(cfg) is None
    assert "outer" not in cfg.model_dump()  # FedAvg summaries are as before
    curtail = CurtailmentConfig()
    assert (curtail.outer, curtail.outer_lr, curtail.outer_momentum) == ("fedavg", 0.7, 0.9)
    for bad in (
        {"outer": "adam"},
        {"outer_lr": 0},
        {"outer_momentum": 1.0},
        {"outer_momentum": -0.1},
    ):
        with pytest.raises(ValidationError):
            build_config("quick", **bad)
        with pytest.raises(ValidationError):
            CurtailmentConfig(**bad)
    nesterov = build_config("quick", outer="nesterov", outer_lr=0.5, outer_momentum=0.8)
    assert nesterov.model_dump()["outer"] == "nesterov"
    outer = outer_for(nesterov)
    assert isinstance(outer, NesterovOuter) and (outer.lr, outer.momentum) == (0.5, 0.8)


def test_the_aggregator_maps_powertrip_outer_variables_onto_the_run():
    env = {"POWERTRIP_PROFILER_ADDR": "localhost:1", "POWERTRIP_INSECURE": "1"}
    assert load_config(AggregatorConfig, env).experiment().outer == "fedavg"
    env |= {
        "POWERTRIP_OUTER": "nesterov",
        "POWERTRIP_OUTER_LR": "0.5",
        "POWERTRIP_OUTER_MOMENTUM": "0.8",
    }
    exp = load_config(AggregatorConfig, env).experiment()
    assert (exp.outer, exp.outer_lr, exp.outer_momentum) == ("nesterov", 0.5, 0.8)
    with pytest.raises(ConfigError, match="POWERTRIP_OUTER_MOMENTUM"):
        load_config(AggregatorConfig, env | {"POWERTRIP_OUTER_MOMENTUM": "1"}).experiment()


@pytest.fixture(scope="module")
def tiny():
    cfg = build_config(None, **TINY, outer="nesterov")
    return cfg, load_workload(cfg)


def emulator(cfg, data, cache: TrajectoryCache, nesterov: bool = True) -> Emulator:
    sites = generate_sites(cfg.num_sites, np.random.default_rng(cfg.site_seed))
    fed = build_federation(cfg, data, 0)
    tm = TimeModel(cfg.ideal_compute_s, cfg.update_bytes, RoundTimeModel.PER_SITE_MAX)
    power, links = StaticPower(sites.base_power), ModelledLinks(sites)
    return Emulator(fed, sites, power, links, tm, 0, cache, outer=cfg if nesterov else None)


def test_the_emulator_takes_the_outer_step_and_a_cached_prefix_brings_its_momentum(tiny):
    cfg, data = tiny
    shared = TrajectoryCache()
    emulator(cfg, data, shared).run(StaticTopK(6), None, 2)
    resumed = emulator(cfg, data, shared).run(SelectAll(), None, 4)  # 2 hits, then 2 steps
    fresh = emulator(cfg, data, TrajectoryCache(max_entries=0)).run(SelectAll(), None, 4)
    fedavg = emulator(cfg, data, TrajectoryCache(), nesterov=False).run(SelectAll(), None, 4)

    assert shared.hits == 2
    assert resumed.rounds == fresh.rounds  # rounds 3-4 stepped from the cached momentum
    assert [r.accuracy for r in fedavg.rounds] != [r.accuracy for r in fresh.rounds]


def test_fedavg_and_nesterov_runs_sharing_a_cache_do_not_mix(tiny):
    cfg, data = tiny
    shared = TrajectoryCache()
    nesterov = emulator(cfg, data, shared).run(SelectAll(), None, 3)
    fedavg = emulator(cfg, data, shared, nesterov=False).run(SelectAll(), None, 3)
    alone = emulator(cfg, data, TrajectoryCache(), nesterov=False).run(SelectAll(), None, 3)
    assert shared.hits == 0 and fedavg.rounds == alone.rounds != nesterov.rounds
