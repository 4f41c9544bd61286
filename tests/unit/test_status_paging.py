"""GetStatus pages the round history: a reply holds at most the page asked for (100 by default,
never more than 1000), paging on from the last round received returns every round exactly once,
and the run holds only the latest rounds, so neither a reply nor the run's memory grows with
the run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from powertrip.rounds.loop import RoundRecord
from powertrip.services.aggregator import run_status
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.lifecycle import Registration, RunLifecycle
from powertrip.services.aggregator.run_status import StatusRound
from powertrip.services.aggregator.servicer import STATUS_PAGE, STATUS_PAGE_MAX, AggregatorServicer
from powertrip.services.common.config import load_config
from powertrip.v1 import aggregator_pb2

PLAINTEXT = SimpleNamespace(auth_context=dict)  # a call without a client certificate


class Executor:
    collector, params = None, {}

    def close(self) -> None: ...


class RecordedRun(RunLifecycle):
    """A run that has recorded ``rounds`` rounds."""

    mode = "recorded"

    def __init__(self, rounds: int) -> None:
        env = {"POWERTRIP_PROFILER_ADDR": "x:1", "POWERTRIP_INSECURE": "1"}
        super().__init__(load_config(AggregatorConfig, env), num_sites=2, expected_sites=2)
        self.executor, self.target = Executor(), None  # type: ignore[assignment]
        for r in range(1, rounds + 1):
            rec = RoundRecord(r, 10.0 * r, 10.0, 2, r / (rounds + 1), 1.0, (0, 1), 2)
            self._record_round(StatusRound(rec), None)

    @property
    def policy_name(self) -> str:
        return "recorded"

    def registration(self) -> Registration:
        return Registration(0, self.mode)


def get(servicer: AggregatorServicer, **paging: int) -> aggregator_pb2.GetStatusResponse:
    return servicer.GetStatus(aggregator_pb2.GetStatusRequest(**paging), PLAINTEXT)


@pytest.mark.reliability("R30")
@pytest.mark.parametrize(
    ("asked", "returned"),
    [(0, STATUS_PAGE), (250, 250), (5000, STATUS_PAGE_MAX), (10**9, STATUS_PAGE_MAX)],
)
def test_a_status_reply_holds_at_most_the_page_asked_for_and_never_above_the_cap(asked, returned):
    reply = get(AggregatorServicer(RecordedRun(3000)), max_rounds=asked)
    assert [r.round for r in reply.rounds] == list(range(1, returned + 1))
    assert reply.total_rounds == 3000 and reply.round == 3000 and reply.more_rounds
    assert reply.first_round == 1


@pytest.mark.reliability("R30")
@pytest.mark.parametrize("page", [0, 7, 1000])
def test_paging_on_from_the_last_round_received_returns_every_round_exactly_once(page):
    servicer = AggregatorServicer(RecordedRun(2345))
    seen, after, replies = [], 0, 0
    while True:
        reply = get(servicer, max_rounds=page, after_round=after)
        replies += 1
        assert len(reply.rounds) <= (page or STATUS_PAGE)
        seen += [r.round for r in reply.rounds]
        if not reply.more_rounds:
            break
        after = reply.rounds[-1].round
    assert seen == list(range(1, 2346))
    assert replies == -(-2345 // (page or STATUS_PAGE))
    assert not get(servicer, after_round=2345).rounds  # nothing past the last round


@pytest.mark.reliability("R30")
def test_the_run_holds_only_the_latest_rounds_and_says_which(monkeypatch):
    monkeypatch.setattr(run_status, "HISTORY", 50)
    run = RecordedRun(120)
    servicer = AggregatorServicer(run)
    reply = get(servicer, max_rounds=1000)
    assert [r.round for r in reply.rounds] == list(range(71, 121))
    assert (reply.first_round, reply.total_rounds, reply.more_rounds) == (71, 120, False)
    assert len(run.status.rounds) == 50
    assert [r.round for r in get(servicer, after_round=100).rounds] == list(range(101, 121))


def test_a_snapshot_copies_one_page_not_the_history():
    run = RecordedRun(500)
    snap = run.status_snapshot(after_round=200, max_rounds=10)
    assert [r.record.round for r in snap.status.rounds] == list(range(201, 211))
    assert snap.more_rounds and snap.first_round == 1 and snap.status.total_rounds == 500
    run._record_round(StatusRound(RoundRecord(501, 0.0, 0.0, 0, 0.0, 0.0)), None)
    assert [r.record.round for r in snap.status.rounds] == list(range(201, 211))
