"""The logged curtailment run (arXiv 2602.22760) replayed on the paper's own carbon trace with the
study's set-up: its mode timeline, the always-on baselines' emissions, and the headline ratios.
Only the scheduler runs (the learner records), so this takes well under a second."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from powertrip.config.curtailment import build_curtail_config
from powertrip.curtailment.availability import always_available, availability_from_trace
from powertrip.curtailment.cursor import ShardCursor
from powertrip.curtailment.emissions import account
from powertrip.curtailment.engine import ElasticEngine
from powertrip.curtailment.run_model import LearnOutcome
from powertrip.curtailment.sites import build_sites
from powertrip.curtailment.wall_clock import WallClockRounds
from powertrip.selection.base import SelectAll
from powertrip.traces.carbon import read_carbon_trace
from tests.needs import real_data_reason

TRAIN_ROWS = 32_000  # 80 % of mnist1d's 40 000 samples (the docs' measured run)
TRACE_STEP_S = 300.0


class NullLearner:
    def evaluate(self):  # noqa: ANN201
        return 0.0, 0.0

    def train_round(self, work, checkpoints):  # noqa: ANN001, ANN201
        n = 0 if checkpoints is None else len(checkpoints.steps)
        return LearnOutcome(0.0, 0.0, None, ((0.0, 0.0),) * n)


@pytest.fixture(scope="module")
def paper(shared_data):
    path = shared_data / "carbon" / "curtail-llm_mci_2026-01-11.csv"
    if not path.is_file():
        pytest.skip(real_data_reason("curtail-llm-mci"))
    cfg = build_curtail_config(
        "curtailment", carbon_trace_path=Path(path), regions=("CAISO_NORTH", "SPP_TX", "NEM_SA")
    )
    trace = read_carbon_trace(path)
    sites = build_sites(cfg, trace)
    rounds = WallClockRounds(cfg.single_site_hours * 3600 / math.ceil(TRAIN_ROWS / 32))

    def run(members, avail, horizon):  # noqa: ANN001, ANN202
        engine = ElasticEngine(members, avail, rounds, 32, horizon, carbon=trace)
        r = engine.run(SelectAll(), NullLearner(), ShardCursor(TRAIN_ROWS, cfg.num_shards))
        return r, account(r.power_logs, trace)

    curtailed = availability_from_trace(trace, [(s.name, s.region) for s in sites])
    ours = run(sites, curtailed, 18 * 3600.0)
    single = run(sites[:1], always_available([("one", "CAISO_NORTH")]), math.inf)
    return trace, ours, single


def test_modes_follow_the_logged_timeline(paper):
    _, (run, _), _ = paper
    modes = run.mode_segments()

    # The logged run: pause until CA trains alone (~527 s), CA alone until deprovisioned (~8125 s),
    # pause, CA alone again (curtailed at ~8391 s + 240 s), federated CA + SA from ~17 025 s,
    # SA alone after CA leaves (~23 750 s), federated SA + TX from ~36 527 s, done (~14.6 h).
    logged = [
        (527, "solo"),
        (8125, "pause"),
        (8391 + 240, "solo"),
        (17_025, "federated"),
        (23_750, "solo"),
        (36_527, "federated"),
    ]
    assert [m for *_, m in modes] == ["pause", *[m for _, m in logged]]
    for (paper_s, mode), (start_s, _, ours) in zip(logged, modes[1:], strict=True):
        assert ours == mode and abs(start_s - paper_s) <= TRACE_STEP_S, (mode, start_s, paper_s)
    assert run.finished and 13.0 <= run.end_s / 3600 <= 14.6


def test_single_site_baselines_reproduce_the_papers_emissions(paper, shared_data):
    trace, _, (single, _) = paper
    paper_kg = {"CAISO_NORTH": 11.41, "SPP_TX": 14.55, "NEM_SA": 12.33, "DE": 27.07}
    paper_share = {"CAISO_NORTH": 0.34, "SPP_TX": 0.38, "NEM_SA": 0.59, "DE": 0.0}

    for region, kg in paper_kg.items():
        logs = [
            type(log)(log.site, region, log.train_kw, log.idle_kw, log.on, log.training)
            for log in single.power_logs
        ]
        e = account(logs, trace)
        assert e.emissions_kg == pytest.approx(kg, rel=0.01), region
        assert e.curtailed_share == pytest.approx(paper_share[region], abs=0.015), region
    assert single.end_s / 3600 == pytest.approx(17.8, abs=0.02)


def test_curtailment_emits_5_to_13_percent_of_a_single_site_and_draws_curtailed_energy(paper):
    trace, (_, ours), (single, _) = paper
    # Paper: 1.38 kg, 12.1 / 9.5 / 11.2 / 5.1 % of CA / TX / SA / DE, 97 % curtailed energy.
    paper_ratio = {"CAISO_NORTH": 0.121, "SPP_TX": 0.095, "NEM_SA": 0.112, "DE": 0.051}

    for region, ratio in paper_ratio.items():
        logs = [
            type(log)(log.site, region, log.train_kw, log.idle_kw, log.on, log.training)
            for log in single.power_logs
        ]
        measured = ours.emissions_kg / account(logs, trace).emissions_kg
        assert measured == pytest.approx(ratio, abs=0.015), region
    assert ours.curtailed_share >= 0.95
    assert ours.energy_kwh == pytest.approx(37.7, rel=0.05)
