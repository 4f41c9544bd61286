"""The lifecycle both aggregator modes share, and the servicer's view of a run through the ``Run``
protocol: a run waits for its sites, trains on its own thread, fails with a reason, and reports
a consistent status whichever mode it is."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from powertrip.rounds.loop import RoundRecord
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.lifecycle import Registration, RunLifecycle
from powertrip.services.aggregator.run_status import RunState, StatusRound
from powertrip.services.aggregator.servicer import AggregatorServicer
from powertrip.services.common.config import load_config
from powertrip.v1 import aggregator_pb2


class StubExecutor:
    def __init__(self) -> None:
        self.collector = None
        self.params: dict = {}
        self.closed = False

    def close(self) -> None:
        self.closed = True


class ToyRun(RunLifecycle):
    """A mode whose training is a given function of the run."""

    mode = "toy"

    def __init__(self, train=lambda run: None, timeout_s: float = 5.0, sites: int = 2) -> None:
        cfg = load_config(
            AggregatorConfig,
            {
                "POWERTRIP_PROFILER_ADDR": "x:1",
                "POWERTRIP_REGISTRATION_TIMEOUT_S": str(timeout_s),
                "POWERTRIP_INSECURE": "1",
            },
        )
        super().__init__(cfg, num_sites=sites, expected_sites=sites)
        self.executor = StubExecutor()  # type: ignore[assignment]
        self.target = 0.9
        self.train = train

    @property
    def policy_name(self) -> str:
        return "toy-policy"

    def registration(self) -> Registration:
        return Registration(7, self.mode, run_config_json="{}")

    def _train(self) -> None:
        self._begin_training()
        self.train(self)


def record(r: int, accuracy: float) -> RoundRecord:
    return RoundRecord(r, 10.0 * r, 10.0, 2, accuracy, 1.0 - accuracy, (0, 1), 2)


def registered(run: ToyRun) -> ToyRun:
    run.registry.register("w", "127.0.0.1:9", [0, 1], True)
    return run


def test_a_run_that_finishes_reports_done_with_its_message():
    run = registered(ToyRun(lambda r: r._finish("all good", clock_s=42.0)))
    run.start().join(5)
    st = run.status_snapshot().status
    assert (st.state, st.message, st.clock_s) == (RunState.DONE, "all good", 42.0)


def test_a_run_fails_naming_the_missing_sites_when_registration_times_out():
    run = ToyRun(timeout_s=0.2)
    run.start().join(5)
    st = run.status_snapshot().status
    assert st.state is RunState.FAILED and "only 0 of 2 sites" in st.message


def test_a_run_stopped_while_waiting_is_not_a_failure_and_closes_its_executor():
    run = ToyRun()
    thread = run.start()
    run.stop()
    thread.join(5)
    assert run.status_snapshot().status.state is RunState.WAITING_FOR_SITES
    assert run.executor.closed


def test_a_crash_fails_the_run_with_the_exception():
    def crash(run: ToyRun) -> None:
        raise ValueError("bad model")

    run = registered(ToyRun(crash))
    run.start().join(5)
    st = run.status_snapshot().status
    assert (st.state, st.message) == (RunState.FAILED, "ValueError: bad model")


def test_time_to_accuracy_is_the_first_round_reaching_the_target():
    run = ToyRun()
    assert not run._record_round(StatusRound(record(1, 0.5)), None)
    assert run._record_round(StatusRound(record(2, 0.95)), 20.0)
    assert not run._record_round(StatusRound(record(3, 0.97)), 30.0)
    st = run.status_snapshot().status
    assert (st.round, st.accuracy, st.time_to_accuracy_s) == (3, 0.97, 20.0)


def test_the_time_to_accuracy_metric_means_not_reached_as_nan_in_every_mode():
    """The gauge reads the same in both modes: NaN until the target is first reached (never 0,
    which would read as "reached instantly"), then that clock time, unchanged by later rounds."""
    run = ToyRun()
    assert math.isnan(REGISTRY.get_sample_value("powertrip_time_to_accuracy_seconds"))
    run._record_round(StatusRound(record(1, 0.5)), None)
    assert math.isnan(REGISTRY.get_sample_value("powertrip_time_to_accuracy_seconds"))
    run._record_round(StatusRound(record(2, 0.95)), 20.0)
    run._record_round(StatusRound(record(3, 0.97)), 30.0)
    assert REGISTRY.get_sample_value("powertrip_time_to_accuracy_seconds") == 20.0


def test_a_snapshot_does_not_change_as_the_run_goes_on():
    run = ToyRun()
    run._record_round(StatusRound(record(1, 0.5)), None)
    snap = run.status_snapshot()
    run._record_round(StatusRound(record(2, 0.6)), None)
    assert [r.record.round for r in snap.status.rounds] == [1]
    assert (snap.expected_sites, snap.policy, snap.target) == (2, "toy-policy", 0.9)


def test_the_servicer_reports_any_run_through_the_protocol():
    run = registered(ToyRun())
    run._record_round(
        StatusRound(record(1, 0.5), start_s=3.0, steps=(4, 5)), None, mode="solo", active_sites=1
    )
    servicer = AggregatorServicer(run)
    plaintext = SimpleNamespace(auth_context=dict)  # a call without a client certificate
    reply = servicer.GetStatus(aggregator_pb2.GetStatusRequest(), plaintext)
    assert reply.policy == "toy-policy" and reply.registered_sites == reply.expected_sites == 2
    assert reply.mode == "solo" and reply.active_sites == 1
    (summary,) = reply.rounds
    assert list(summary.steps) == [4, 5] and summary.start_seconds == 3.0
    assert list(summary.selected_site_ids) == ["site-000", "site-001"]
    heartbeat = aggregator_pb2.RegisterWorkerRequest(
        worker_id="w", address="127.0.0.1:9", site_ids=["site-000", "site-001"], ready=True
    )
    reg = servicer.RegisterWorker(heartbeat, plaintext)
    assert (reg.run_seed, reg.mode, reg.run_config_json) == (7, "toy", "{}")
    assert reg.curtail_config_json == ""


@pytest.mark.parametrize("state", list(RunState))
def test_run_states_match_the_wire_enum(state):
    assert aggregator_pb2.RunState.Name(int(state)) == f"RUN_STATE_{state.name}"


def test_status_updates_from_the_run_thread_are_seen_whole():
    seen = threading.Event()

    def train(run: ToyRun) -> None:
        for r in range(1, 50):
            run._record_round(StatusRound(record(r, r / 100)), None)
        seen.set()

    run = registered(ToyRun(train))
    run.start()
    while not seen.is_set():
        st = run.status_snapshot().status
        assert not st.rounds or st.rounds[-1].record.round == st.round
    st = run.status_snapshot().status
    assert st.round == 49 and len(st.rounds) == 49
