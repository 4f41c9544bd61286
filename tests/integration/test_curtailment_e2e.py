"""Curtailment mode over real processes: the profiler serves availability and the carbon trace,
the aggregator plays the elastic run on the emulated clock, three workers (one region each)
train their stream rows. The run makes the decisions of ``powertrip curtail``'s curtailment run
for the same configuration and reports the same energy and emissions.

The same cluster then serves the reliability runs of R37: the aggregator SIGKILLed in a
sub-round and in a checkpoint write resumes and ends bit-identical to the first (golden) run,
and a worker killed at its first upload leaves its sub-round to the sites that reported."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from powertrip.config.curtailment import build_curtail_config
from powertrip.learning.model_file import read_model
from powertrip.services.aggregator import checkpoint
from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.services.cli.model import pull_model
from powertrip.sites.profiles import site_id
from powertrip.study.curtailment import run_curtailment_study
from powertrip.v1 import aggregator_pb2
from tests.integration.test_crash_recovery import model_sha256
from tests.integration.test_services_e2e import scrape

pytestmark = pytest.mark.slow

PRESET = "curtailment-quick"
SITES = 3  # the embedded synthetic trace's three regions, one site each


@dataclass
class Bench:
    cluster: LocalCluster
    out: Path
    golden: aggregator_pb2.GetStatusResponse
    final: aggregator_pb2.GetStatusResponse | None = None  # the last unarmed restart's end


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """The golden run, checkpointed; the cluster stays up for the reliability runs."""
    out = tmp_path_factory.mktemp("curtail-up")
    plan = ClusterPlan(
        workers=3,
        sites=SITES,
        log_dir=out / "logs",
        mode="curtailment",
        curtail_preset=PRESET,
        checkpoint_dir=out / "golden",
        round_deadline_s=20,
        extra_env={"POWERTRIP_HEARTBEAT_S": "0.5"},  # workers find a restarted aggregator soon
    )
    with LocalCluster(plan) as cluster:
        cluster.start()
        status = cluster.wait_done(timeout_s=120)
        metrics = {s.name: scrape(s.metrics_url) for s in cluster.services}
        yield Bench(cluster, out, status), metrics


@pytest.fixture(scope="module")
def finished_run(bench):
    b, metrics = bench
    return b.golden, metrics


@pytest.fixture(scope="module")
def emulated():
    study = run_curtailment_study(build_curtail_config(PRESET, policies=("curtailment",)))
    return study.results["curtailment"]


def test_the_run_completes_on_data_exhaustion(finished_run):
    status, _ = finished_run
    assert status.state == aggregator_pb2.RUN_STATE_DONE, status.message
    assert status.policy == "curtailment" and "data used up" in status.message
    assert status.registered_sites == SITES


def test_the_final_model_is_left_in_the_checkpoint_directory_and_served_alike(bench):
    b, _ = bench
    final, card = read_model(b.out / "golden" / "model.safetensors")
    channel = b.cluster.operator_channel(b.cluster.aggregator.grpc_addr)
    with channel:
        served, served_card = pull_model(channel, 1 << 30, 60)

    assert card.study == "curtailment"
    assert (card.round, card.accuracy) == (b.golden.round, b.golden.accuracy)
    assert served_card == card
    assert all(np.array_equal(final[k], served[k]) for k in final)


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


def rows(status: aggregator_pb2.GetStatusResponse) -> list[tuple]:
    return [
        (
            r.round,
            list(r.selected_site_ids),
            list(r.steps),
            r.accuracy,
            r.loss,
            r.start_seconds,
            r.clock_seconds,
            r.outcome,
        )
        for r in status.rounds
    ]


def start_aggregator(b: Bench, ckpts: Path, armed: str | None) -> str:
    """Start the aggregator again on its port with ``ckpts`` and a crash point ``armed``
    (None: none); an armed one must die by SIGKILL, an unarmed one must end the run. What this
    process logged."""
    log = b.cluster.aggregator.log_path
    assert log is not None
    log_from = log.stat().st_size
    env = {"POWERTRIP_CHECKPOINT_DIR": str(ckpts), "POWERTRIP_FAULT_INJECT": armed or ""}
    b.cluster.restart("aggregator", **env)
    if armed:
        assert b.cluster.aggregator.process.wait(timeout=120) == -signal.SIGKILL, armed
    else:
        b.final = b.cluster.wait_done(timeout_s=120)
    with log.open("rb") as f:
        f.seek(log_from)
        return f.read().decode(errors="replace")


@pytest.mark.reliability("R37")
def test_the_aggregator_killed_in_a_sub_round_and_a_checkpoint_write_resumes_bit_identical(bench):
    """SIGKILL half-way through a sub-round, then in the middle of a checkpoint write: each
    restart resumes from the newest checkpoint, and the run ends with the golden run's rounds
    (sites, steps, accuracies, clock) and its final model, bit for bit."""
    b, _ = bench
    golden = checkpoint.load_latest(b.out / "golden")
    assert golden is not None and golden.round == len(b.golden.rounds)
    sub_rounds = golden.state["components"]["learner"]["sub_rounds"]
    assert sub_rounds > golden.round >= 6  # rounds to cut, some with a lone site's chunks
    crashed = b.out / "crashed"

    start_aggregator(b, crashed, f"aggregation@{sub_rounds // 2}")
    first = checkpoint.load_latest(crashed)
    assert first is not None and 0 < first.round < golden.round - 2

    log = start_aggregator(b, crashed, f"checkpoint-write@{first.round + 2}")
    assert f"resuming after round {first.round} " in log

    log = start_aggregator(b, crashed, None)
    assert f"resuming after round {first.round + 1} " in log
    final = b.final
    assert final is not None and final.state == aggregator_pb2.RUN_STATE_DONE, final.message
    assert rows(final) == rows(b.golden)
    assert (final.energy_kwh, final.emissions_kg) == (b.golden.energy_kwh, b.golden.emissions_kg)
    assert model_sha256(crashed) == model_sha256(b.out / "golden")


@pytest.mark.reliability("R37")
def test_a_worker_killed_at_its_first_upload_leaves_the_sub_round_to_the_others(bench):
    """worker-0 dies (SIGKILL) uploading site-000's first update, in a federated round, and is
    restarted. Every round in which another site trained folds the updates that arrived,
    work-weighted, instead of failing (site-000's untrained rows go back to the pool); only a
    round in which site-000 trained alone can fail, and the run ends."""
    b, _ = bench
    first = next(r for r in b.golden.rounds if "site-000" in r.selected_site_ids)
    assert len(first.selected_site_ids) >= 2
    log = b.cluster.aggregator.log_path
    assert log is not None
    log_from = log.stat().st_size
    b.cluster.restart("worker-0", POWERTRIP_FAULT_INJECT="upload@1")  # its first upload
    b.cluster.restart("aggregator", POWERTRIP_CHECKPOINT_DIR=str(b.out / "lost"))
    worker = next(s for s in b.cluster.services if s.name == "worker-0")
    assert worker.process.wait(timeout=120) == -signal.SIGKILL
    b.cluster.restart("worker-0", POWERTRIP_FAULT_INJECT="")
    final = b.cluster.wait_done(timeout_s=120)
    by_round = {r.round: r for r in final.rounds}
    hit = by_round[first.round]
    assert hit.outcome == "completed" and list(hit.selected_site_ids) == list(
        first.selected_site_ids
    )
    assert hit.contributions == len(hit.selected_site_ids) - 1
    for r in final.rounds:
        if set(r.selected_site_ids) != {"site-000"}:
            assert r.outcome == "completed", r
    assert final.state == aggregator_pb2.RUN_STATE_DONE or "without any update" in final.message
    with log.open("rb") as f:
        f.seek(log_from)
        text = f.read().decode(errors="replace")
    assert f"round {first.round}, sub-round" in text and "no update from site-000" in text
    assert "left to the sites that reported" in text
    failed = [r.round for r in final.rounds if r.outcome == "failed"]
    print(f"\nworker killed: {final.message}; failed rounds {failed} of {len(final.rounds)}")
