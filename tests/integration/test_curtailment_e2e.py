"""Curtailment mode over real processes: the profiler serves availability and the carbon trace,
the aggregator plays the elastic run on the emulated clock, three workers (one region each)
train their stream rows. The run makes the decisions of ``powertrip curtail``'s curtailment run
for the same configuration and reports the same energy and emissions."""

from __future__ import annotations

import pytest

from powertrip.curtailment.config import build_curtail_config
from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.sites import site_id
from powertrip.study.curtailment import run_curtailment_study
from powertrip.v1 import aggregator_pb2
from tests.integration.test_services_e2e import scrape

pytestmark = pytest.mark.slow

PRESET = "curtailment-quick"
SITES = 3  # the embedded synthetic trace's three regions, one site each


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("curtail-up")
    plan = ClusterPlan(
        workers=3,
        sites=SITES,
        log_dir=out / "logs",
        mode="curtailment",
        curtail_preset=PRESET,
    )
    with LocalCluster(plan) as cluster:
        cluster.start()
        status = cluster.wait_done(timeout_s=120)
        metrics = {s.name: scrape(s.metrics_url) for s in cluster.services}
    yield status, metrics


@pytest.fixture(scope="module")
def emulated():
    study = run_curtailment_study(build_curtail_config(PRESET, policies=("curtailment",)))
    return study.results["curtailment"]


def test_the_run_completes_on_data_exhaustion(finished_run):
    status, _ = finished_run
    assert status.state == aggregator_pb2.RUN_STATE_DONE, status.message
    assert status.policy == "curtailment" and "data used up" in status.message
    assert status.registered_sites == SITES


def test_rounds_sites_and_work_equal_the_emulators(finished_run, emulated):
    """Scheduling is exact: the same rounds, participants, steps and clock times, bit for bit
    (the engine is the emulator's; only the training moved to the workers)."""
    status, _ = finished_run
    rounds = emulated.run.rounds
    assert len(status.rounds) == len(rounds)
    for svc, emu in zip(status.rounds, rounds, strict=True):
        assert list(svc.selected_site_ids) == [site_id(s) for s in emu.participants], svc.round
        assert list(svc.steps) == [w.steps for w in emu.work], svc.round
        assert svc.start_seconds == emu.start_s
        assert svc.clock_seconds == emu.end_s
    modes = {len(r.contributors) for r in rounds}
    assert {1, 2} <= modes  # the run has both solo and federated rounds


def test_energy_and_emissions_equal_the_emulators(finished_run, emulated):
    status, _ = finished_run
    assert status.energy_kwh == emulated.energy.energy_kwh  # the same emissions.account call
    assert status.emissions_kg == emulated.energy.emissions_kg


def test_learning_follows_the_emulator(finished_run, emulated):
    """The same deltas, folded in the same order. Identical in practice, but not guaranteed to
    the last bit (the emulator trains a round's sites in one vmapped batch, a worker only its
    own), hence the tolerance of a few held-out predictions."""
    status, _ = finished_run
    for svc, emu in zip(status.rounds, emulated.run.rounds, strict=True):
        assert svc.accuracy == pytest.approx(emu.accuracy, abs=0.005), svc.round


def test_metrics_expose_energy_emissions_mode_and_active_sites(finished_run, emulated):
    status, metrics = finished_run
    agg = metrics["aggregator"]
    energy = {lab["site"]: v / 3.6e6 for lab, v in agg["powertrip_energy_joules_total"]}  # kWh
    grams = {lab["site"]: v for lab, v in agg["powertrip_emissions_grams_total"]}
    assert set(energy) == set(grams) == {site_id(i) for i in range(SITES)}
    assert sum(energy.values()) == pytest.approx(status.energy_kwh, rel=1e-6)
    assert sum(grams.values()) == pytest.approx(status.emissions_kg * 1000, rel=1e-6)
    assert agg["powertrip_mode"] == [({}, 0.0)]  # paused once the data is used up
    assert agg["powertrip_active_sites"] == [({}, 0.0)]
    assert agg["powertrip_round_current"][0][1] == len(emulated.run.rounds)
