"""The aggregator's open round: folds happen in selection order whatever the arrival order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from powertrip.aggregation.fedavg import StreamingFedAvg
from powertrip.aggregation.robust import Aggregation
from powertrip.aggregation.robust_fedavg import RobustFedAvg
from powertrip.rounds.journal import JournalEntry
from powertrip.rounds.loop import RoundOutcome
from powertrip.services.aggregator.collector import RoundCollector, RoundGate
from powertrip.services.common.errors import Duplicate, StaleRound
from powertrip.services.common.tensor_receiver import TensorStreamReceiver
from powertrip.services.common.tensor_stream import encode, specs_of

TEMPLATE = {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}
SELECTED = [5, 2, 9]
#: these tests pin the FedAvg fold's mechanics (order, in-place folds, undo); the default rule,
#: robust, folds the same sums with clip factors (its own test at the end)
FEDAVG = Aggregation("fedavg")


def update(site: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(site)
    return {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in TEMPLATE.items()}


def stream(site: int) -> TensorStreamReceiver:
    rx = TensorStreamReceiver(specs_of(TEMPLATE))
    parts = list(encode(update(site), 8))
    rx.header(parts[0])
    for c in parts[1:-1]:
        rx.chunk(c)
    rx.trailer(parts[-1])
    return rx


def deliver(col: RoundCollector, site: int) -> None:
    col.admit(site, col.round)
    col.commit(site, stream(site), weight=float(site))


@pytest.mark.parametrize("arrival", list(itertools.permutations(SELECTED)))
def test_the_sum_is_bit_identical_to_folding_in_selection_order(arrival):
    col = RoundCollector(1, SELECTED, TEMPLATE, aggregation=FEDAVG)
    for s in arrival:
        deliver(col, s)
    col.close()
    ref = StreamingFedAvg(TEMPLATE)
    for s in SELECTED:
        ref.add(update(s), float(s))
    got, want = col.agg.apply(TEMPLATE), ref.apply(TEMPLATE)
    assert col.accepted == SELECTED
    assert all(np.array_equal(got[k], want[k]) for k in TEMPLATE)


def test_a_failed_site_is_skipped_once_the_round_closes():
    col = RoundCollector(1, SELECTED, TEMPLATE, aggregation=FEDAVG)
    deliver(col, 9)
    col.fail(5, "start_unavailable")
    deliver(col, 2)
    assert col.done and col.accepted == []  # 5 might still resend until the round closes
    col.close()
    assert col.accepted == [2, 9] and col.failed == {5: "start_unavailable"}


def test_missing_sites_fail_with_deadline_when_the_round_closes():
    col = RoundCollector(1, SELECTED, TEMPLATE, aggregation=FEDAVG)
    deliver(col, 5)
    assert not col.wait(0.05)
    col.close()
    assert col.failed == {2: "deadline", 9: "deadline"} and col.accepted == [5]


def test_stale_duplicate_and_unselected_updates_are_refused():
    col = RoundCollector(4, SELECTED, TEMPLATE, aggregation=FEDAVG)
    with pytest.raises(StaleRound, match="not open"):
        col.admit(5, 3)
    with pytest.raises(StaleRound, match="not selected"):
        col.admit(1, 4)
    deliver(col, 5)
    with pytest.raises(Duplicate):
        col.admit(5, 4)
    col.close()
    with pytest.raises(StaleRound, match="closed"):
        col.admit(2, 4)


def test_the_split_half_sum_takes_every_other_selected_site():
    col = RoundCollector(1, SELECTED, TEMPLATE, split_half=True, aggregation=FEDAVG)
    for s in SELECTED:
        deliver(col, s)
    col.close()
    assert col.half is not None and col.half.count == 2  # sites 5 and 9
    assert col.half.total_weight == 5.0 + 9.0


def test_streamed_updates_project_on_the_direction_like_whole_ones():
    direction = update(1)
    col = RoundCollector(1, SELECTED, TEMPLATE, direction=direction, aggregation=FEDAVG)
    ref = StreamingFedAvg(TEMPLATE, direction=direction)
    for s in SELECTED:
        deliver(col, s)
        ref.add(update(s), float(s))
    col.close()
    assert col.agg.projection() == pytest.approx(ref.projection(), rel=1e-6)


def test_journal_entries_keep_the_projection_and_read_old_journals():
    entry = JournalEntry(
        3, (1, 2), RoundOutcome(0.5, 1.2, (2.0, 1.0, 2.0), 2, projection=(0.5, 1.0))
    )
    back = JournalEntry.from_json(entry.to_json())
    assert back.outcome is not None and back.outcome.projection == (0.5, 1.0)
    old = entry.to_json()
    del old["outcome"]["projection"]  # written before projections existed
    assert JournalEntry.from_json(old).outcome.projection is None


class CountingGate(RoundGate):
    """The smallest gate (an item per site), counting the ``_delivered`` calls it is asked; it
    stops a quadratic gate at once instead of letting it run for minutes."""

    def __init__(self, round_index: int, selected: list[int]) -> None:
        super().__init__(round_index, selected)
        self.kept: dict[int, object] = {}
        self.calls = 0
        self.budget = 10 * len(selected)

    def _delivered(self, site: int) -> bool:
        self.calls += 1
        assert self.calls <= self.budget, "the gate scans every site per update"
        return site in self.kept

    def _keep(self, site: int, item: object, weight: float) -> None:
        self.kept[site] = item


def test_a_20000_site_gate_does_constant_work_per_update_and_wake():
    n = 20_000
    gate = CountingGate(1, list(range(n)))
    for s in range(n):
        if s % 10 == 9:
            gate.fail(s, "start_unavailable")
        else:
            gate.admit(s, 1)
            gate.commit(s, None, 1.0)  # type: ignore[arg-type]
        assert gate.done == (s == n - 1)  # what a waiting executor checks on every wake
    assert gate.wait(0)
    gate.close()
    assert len(gate.kept) == n - n // 10 and len(gate.failed) == n // 10
    assert gate.calls <= 3 * n  # admit + commit, or fail; then close's pass


def test_a_site_that_failed_while_its_update_streamed_counts_as_delivered():
    col = RoundCollector(1, SELECTED, TEMPLATE, aggregation=FEDAVG)
    col.admit(5, 1)
    col.fail(5, "start_deadline_exceeded")  # the start RPC gave up; the upload went on
    col.commit(5, stream(5), weight=5.0)
    assert col.failed == {} and not col.done
    deliver(col, 2)
    deliver(col, 9)
    assert col.done
    col.close()
    assert col.accepted == SELECTED and col.failed == {}


def test_a_second_stream_of_a_delivered_site_is_refused_and_released():
    col = RoundCollector(1, SELECTED, TEMPLATE, aggregation=FEDAVG)
    col.admit(5, 1)
    col.fail(5, "start_deadline_exceeded")
    col.admit(5, 1)  # resent whole while the first stream was still running
    col.commit(5, stream(5), weight=5.0)
    second = stream(5)
    with pytest.raises(Duplicate):
        col.commit(5, second, weight=5.0)
    assert second._spool.closed
    for s in (2, 9):
        deliver(col, s)
    col.close()
    assert col.accepted == SELECTED


def test_the_first_fold_waits_for_the_accumulator_prefault(monkeypatch):
    """The prefault writes zeros into the sums: a fold that did not wait for it would be lost."""
    import time

    def slow(self):  # a prefault that is still writing zeros when the first update arrives
        if self.count == 0:
            time.sleep(0.3)
            for acc in self._sum.values():
                acc.fill(0)

    monkeypatch.setattr(StreamingFedAvg, "prefault", slow)
    col = RoundCollector(1, SELECTED, TEMPLATE, aggregation=FEDAVG)
    for s in SELECTED:
        deliver(col, s)
    col._prefault.join()  # whatever it wrote is in the sums now
    ref = StreamingFedAvg(TEMPLATE)
    for s in SELECTED:
        ref.add(update(s), float(s))
    got, want = col.agg.apply(TEMPLATE), ref.apply(TEMPLATE)
    assert all(np.array_equal(got[k], want[k]) for k in TEMPLATE)


def test_a_prefault_after_an_update_is_folded_changes_nothing():
    agg = StreamingFedAvg(TEMPLATE)
    agg.add(update(1), 2.0)
    before = {k: v.copy() for k, v in agg.mean_delta().items()}
    agg.prefault()
    assert all(np.array_equal(agg.mean_delta()[k], before[k]) for k in TEMPLATE)


@pytest.mark.parametrize("arrival", list(itertools.permutations(SELECTED)))
def test_the_default_robust_rule_folds_in_selection_order_as_the_library_rule(arrival):
    """By default the collector folds with the robust rule (no in-place fold: an update is
    judged by its whole norm), whatever the arrival order, as the library folds the same
    updates one after the other: same decisions, same sums."""
    col = RoundCollector(1, SELECTED, TEMPLATE)
    for s in arrival:
        deliver(col, s)
    col.close()
    assert isinstance(col.agg, RobustFedAvg) and col.direct_sink(5, 5.0) is None
    ref = RobustFedAvg(TEMPLATE)
    for s in SELECTED:
        ref.add(update(s), float(s))
    assert (col.agg.clipped, col.agg.norms) == (ref.clipped, ref.norms)
    got, want = col.agg.apply(TEMPLATE), ref.apply(TEMPLATE)
    assert all(np.array_equal(got[k], want[k]) for k in TEMPLATE)
