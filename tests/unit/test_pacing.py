"""POWERTRIP_PACE: an emulated run stretched over wall time so a Prometheus can watch it unfold,
with the same rounds and results as an unpaced run; refused where it means nothing."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

from powertrip.config.experiment import build_config
from powertrip.config.sites import RoundTimeModel
from powertrip.federation import build_federation, load_workload
from powertrip.rounds.emulate import Emulator, TimeModel, TrajectoryCache
from powertrip.rounds.loop import RoundRecord
from powertrip.selection.registry import build_policy
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.lifecycle import Registration, RunLifecycle
from powertrip.services.aggregator.pacing import Pacer
from powertrip.services.aggregator.run_status import RunState, StatusRound
from powertrip.services.cli.up import up
from powertrip.services.common.command_line import env_help
from powertrip.services.common.config import ConfigError, load_config
from powertrip.sites.profiles import ModelledLinks, StaticPower, generate_sites

AGG = {"POWERTRIP_PROFILER_ADDR": "profiler:50052", "POWERTRIP_INSECURE": "1"}


class FakeWall:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_an_unpaced_run_never_waits():
    wall = FakeWall()
    pacer = Pacer(0.0, wall)
    assert pacer.hold_s(1e9) == 0.0


def test_a_paced_run_waits_until_the_run_clock_is_due():
    wall = FakeWall()
    pacer = Pacer(10.0, wall)  # 10 run-clock seconds per wall second
    pacer.restart()
    assert pacer.hold_s(50.0) == pytest.approx(5.0)
    wall.now += 2.0  # the round itself took 2 s of wall time
    assert pacer.hold_s(50.0) == pytest.approx(3.0)


def test_a_slow_round_is_not_made_up_for():
    wall = FakeWall()
    pacer = Pacer(10.0, wall)
    pacer.restart()
    wall.now += 30.0  # far behind the pace: no wait, and no hurry later either
    assert pacer.hold_s(50.0) == 0.0
    assert pacer.hold_s(400.0) == pytest.approx(10.0)


def test_a_replayed_round_moves_the_origin_of_the_pace():
    wall = FakeWall()
    pacer = Pacer(10.0, wall)
    pacer.restart()
    wall.now += 0.5
    pacer.restart(1000.0)  # a restarted run replayed its journal up to 1000 s at full speed
    assert pacer.hold_s(1100.0) == pytest.approx(10.0)


# --------------------------------------------------------------------------------------------
# settings


@pytest.mark.parametrize(
    ("value", "why"),
    [("-1", "greater than or equal to 0"), ("nan", "finite"), ("fast", "valid number")],
)
def test_a_bad_pace_is_refused_naming_the_variable_on_one_line(value, why):
    with pytest.raises(ConfigError) as exc:
        load_config(AggregatorConfig, {**AGG, "POWERTRIP_PACE": value})
    message = str(exc.value)
    assert message.startswith(f"POWERTRIP_PACE={value!r}") and why in message
    assert "\n" not in message


def test_pacing_a_wall_clock_run_is_refused():
    with pytest.raises(ConfigError, match="POWERTRIP_PACE paces the emulated clock"):
        load_config(AggregatorConfig, {**AGG, "POWERTRIP_PACE": "60", "POWERTRIP_CLOCK": "wall"})
    cfg = load_config(AggregatorConfig, {**AGG, "POWERTRIP_PACE": "0", "POWERTRIP_CLOCK": "wall"})
    assert cfg.pace == 0.0


def test_the_pace_defaults_to_as_fast_as_possible_and_is_in_the_help():
    assert load_config(AggregatorConfig, AGG).pace == 0.0
    assert load_config(AggregatorConfig, {**AGG, "POWERTRIP_PACE": "60"}).pace == 60.0
    text = env_help(AggregatorConfig)
    assert "POWERTRIP_PACE" in text and "run-clock seconds per wall second" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pace", "-1"], "Invalid value for '--pace': -1.0 is not in the range x>=0"),
        (["--pace", "10", "--clock", "wall"], "--pace paces the emulated clock"),
    ],
)
def test_up_refuses_a_pace_it_cannot_use_before_starting_anything(args, message, tmp_path):
    result = CliRunner().invoke(up, [*args, "--output", str(tmp_path / "out")])
    assert result.exit_code == 2  # bad input, as up's other refusals
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()  # nothing started


# --------------------------------------------------------------------------------------------
# a paced run: the same rounds, later


class StubExecutor:
    collector = None
    params: dict = {}

    def close(self) -> None:
        pass


class EmulatedRun(RunLifecycle):
    """A lifecycle whose training is the emulator's round loop, recorded and paced after each
    round as the aggregator's modes do."""

    mode = "emulated"

    def __init__(self, emulator: Emulator, pace: float, max_rounds: int = 3) -> None:
        env = {**AGG, "POWERTRIP_PACE": str(pace)}
        super().__init__(load_config(AggregatorConfig, env), num_sites=1, expected_sites=0)
        self.executor = StubExecutor()  # type: ignore[assignment]
        self.target = 0.99
        self.emulator = emulator
        self.max_rounds = max_rounds
        self.records: list[RoundRecord] = []

    @property
    def policy_name(self) -> str:
        return "select-all"

    def registration(self) -> Registration:
        return Registration(0, self.mode)

    def _on_round(self, rec: RoundRecord) -> None:
        self.records.append(rec)
        self._record_round(StatusRound(rec), None)
        self._pace(rec.time_s)

    def _train(self) -> None:
        self._begin_training()
        self.emulator.run(build_policy("select-all"), None, self.max_rounds, self._on_round)
        self._finish("done", clock_s=self.records[-1].time_s)


@pytest.fixture(scope="module")
def emulator_factory():
    cfg = build_config(None, num_sites=4, num_samples=400, max_rounds=5, ideal_compute_s=10.0)
    data = load_workload(cfg)
    sites = generate_sites(cfg.num_sites, np.random.default_rng(cfg.site_seed))
    tm = TimeModel(cfg.ideal_compute_s, cfg.update_bytes, RoundTimeModel.PER_SITE_MAX)

    def make() -> Emulator:  # no cache: the paced run trains again, as a service run would
        fed = build_federation(cfg, data, 0)
        return Emulator(
            fed,
            sites,
            StaticPower(sites.base_power),
            ModelledLinks(sites),
            tm,
            0,
            TrajectoryCache(max_entries=0),
        )

    return make


def timed(run: EmulatedRun) -> float:
    began = time.monotonic()
    run.run()
    return time.monotonic() - began


def test_a_paced_run_has_the_same_rounds_and_takes_clock_over_pace(emulator_factory):
    unpaced = EmulatedRun(emulator_factory(), pace=0)
    fast = timed(unpaced)
    clock_s = unpaced.records[-1].time_s
    pace = clock_s / (fast + 0.6)  # ~0.6 s longer than as fast as possible
    paced = EmulatedRun(emulator_factory(), pace=pace)
    slow = timed(paced)
    assert unpaced.status.state == paced.status.state == RunState.DONE
    assert paced.records == unpaced.records
    a, b = unpaced.status_snapshot().status, paced.status_snapshot().status
    assert (a.state, a.round, a.accuracy, a.clock_s) == (b.state, b.round, b.accuracy, b.clock_s)
    assert slow >= clock_s / pace - 0.05  # the wait is measured from when training began
    assert slow > fast + 0.3


def test_stopping_a_paced_run_cuts_its_wait_short(emulator_factory):
    run = EmulatedRun(emulator_factory(), pace=1e-3)  # the first round is due in hours
    thread = threading.Thread(target=run.run)
    began = time.monotonic()
    thread.start()
    while not run.records and time.monotonic() - began < 30:
        time.sleep(0.01)
    assert len(run.records) == 1 and thread.is_alive()  # waiting after round 1
    run.stop()
    thread.join(10)  # this loop has no stop check of its own: the rounds left run unpaced
    assert not thread.is_alive() and len(run.records) == run.max_rounds
