"""The update whose turn it is folds straight from its chunks; one ahead of its turn spools
until its turn comes. Either way the round's sums equal the all-spooled fold bit for bit, and a
stream that fails after part of it was folded leaves nothing behind."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.aggregation.fold_in_place import FoldCancelled
from powertrip.aggregation.robust import Aggregation
from powertrip.services.aggregator.collector import RoundCollector
from powertrip.services.common.errors import StaleRound
from powertrip.services.common.tensor_receiver import TensorStreamReceiver
from powertrip.services.common.tensor_stream import StreamError, encode, specs_of
from powertrip.v1 import common_pb2

TEMPLATE = {
    "w": np.zeros((40, 9), np.float32),
    "b": np.zeros(7, np.float32),
    "s": np.zeros((), np.float32),
}
MODEL = specs_of(TEMPLATE)
#: the in-place fold is FedAvg's (the default robust rule spools: the last test)
FEDAVG = Aggregation("fedavg")
SELECTED = [4, 1, 7]


def update(site: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(site)
    return {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in TEMPLATE.items()}


class Stream:
    """One site's upload, fed chunk by chunk to a receiver wired as the servicer wires it."""

    def __init__(self, col: RoundCollector, site: int, chunk: int = 100, bf16: bool = False):
        self.col, self.site, self.weight = col, site, float(site + 1)
        col.admit(site, col.round)
        self.rx = TensorStreamReceiver(MODEL, sink_for=lambda: col.direct_sink(site, self.weight))
        self.parts = list(encode(update(site), chunk, bf16))
        self.rx.header(self.parts[0])
        self.chunks, self.sent = self.parts[1:-1], 0

    def send(self, n: int | None = None) -> None:
        todo = self.chunks[self.sent :] if n is None else self.chunks[self.sent : self.sent + n]
        for c in todo:
            self.rx.chunk(c)
            self.sent += 1

    def finish(self) -> None:
        self.send()
        self.rx.trailer(self.parts[-1])
        self.col.commit(self.site, self.rx, self.weight)


def spooled_sums(sites, bf16: bool = False) -> dict[str, bytes]:
    """The reference: every update spooled whole, then folded in selection order."""
    col = RoundCollector(1, SELECTED, TEMPLATE, split_half=True, aggregation=FEDAVG)
    for s in sites:
        col.admit(s, 1)
        rx = TensorStreamReceiver(MODEL)
        parts = list(encode(update(s), 100, bf16))
        rx.header(parts[0])
        for c in parts[1:-1]:
            rx.chunk(c)
        rx.trailer(parts[-1])
        col.commit(s, rx, float(s + 1))
    col.close()
    return sums(col)


def sums(col: RoundCollector) -> dict[str, bytes]:
    out = {}
    for label, agg in (("all", col.agg), ("half", col.half)):
        for k, v in TEMPLATE.items():
            out[f"{label}/{k}"] = agg.region(k, 0, v.size).tobytes()
    return out


@pytest.mark.parametrize("chunk", [100, 4, 1001])  # 1001: elements split across chunks
@pytest.mark.parametrize("bf16", [False, True])
def test_in_turn_updates_fold_as_they_arrive_and_equal_the_spooled_fold(chunk, bf16):
    col = RoundCollector(1, SELECTED, TEMPLATE, split_half=True, aggregation=FEDAVG)
    streams = [Stream(col, s, chunk, bf16) for s in SELECTED]
    for st in streams:
        st.finish()
    assert all(st.rx.sink is not None for st in streams)  # each was in turn when it streamed
    col.close()
    assert col.accepted == SELECTED
    assert sums(col) == spooled_sums(SELECTED, bf16)


def test_an_update_ahead_of_its_turn_spools_then_folds_directly_once_its_turn_comes():
    col = RoundCollector(1, SELECTED, TEMPLATE, split_half=True, aggregation=FEDAVG)
    first, second, third = (Stream(col, s) for s in SELECTED)
    second.send(3)  # ahead of its turn: spooled
    third.finish()  # complete, waits in its spool
    assert second.rx.sink is None and third.rx.sink is None
    first.finish()  # in turn: folded as it came; now the second's turn
    second.send(1)  # its prefix replayed into the fold, the rest goes straight in
    assert second.rx.sink is not None
    second.finish()  # the third, waiting, folds after it
    col.close()
    assert col.accepted == SELECTED
    assert sums(col) == spooled_sums(SELECTED)


@pytest.mark.parametrize("failure", ["truncated", "checksum", "non_finite"])
def test_a_stream_that_fails_mid_fold_leaves_nothing_and_the_round_goes_on(failure):
    col = RoundCollector(1, SELECTED, TEMPLATE, split_half=True, aggregation=FEDAVG)
    first = Stream(col, SELECTED[0])
    first.finish()
    bad = Stream(col, SELECTED[1])
    bad.send(5)
    assert bad.rx.sink is not None
    with pytest.raises(StreamError):
        if failure == "truncated":
            bad.rx.trailer(bad.parts[-1])
        elif failure == "checksum":
            bad.send()
            bad.rx.trailer(common_pb2.TensorStreamTrailer(xxh3_128="0" * 32))
        else:
            poisoned = np.full(25, np.nan, np.float32).tobytes()
            bad.rx.chunk(common_pb2.TensorChunk(offset_bytes=bad.rx.received, data=poisoned))
    col.fail(SELECTED[1], failure)
    Stream(col, SELECTED[2]).finish()  # waits: the failed site may still resend
    col.close()
    assert col.accepted == [SELECTED[0], SELECTED[2]]
    assert sums(col) == spooled_sums([SELECTED[0], SELECTED[2]])


def test_a_failed_site_resends_whole_and_folds_in_turn():
    col = RoundCollector(1, SELECTED, TEMPLATE, split_half=True, aggregation=FEDAVG)
    Stream(col, SELECTED[0]).finish()
    Stream(col, SELECTED[1]).send(4)
    col.fail(SELECTED[1], "aborted")
    for s in SELECTED[1:]:
        Stream(col, s).finish()
    col.close()
    assert col.accepted == SELECTED
    assert sums(col) == spooled_sums(SELECTED)


def test_a_round_closed_during_a_fold_undoes_it_and_refuses_the_rest_of_the_stream():
    col = RoundCollector(1, SELECTED, TEMPLATE, split_half=True, aggregation=FEDAVG)
    Stream(col, SELECTED[0]).finish()
    late = Stream(col, SELECTED[1])
    late.send(4)
    assert late.rx.sink is not None
    col.close()  # the deadline: what arrived is aggregated, the half-folded update is not
    with pytest.raises(FoldCancelled):
        late.send(1)
    with pytest.raises(StaleRound):
        col.commit(SELECTED[1], late.rx, late.weight)
    assert col.accepted == [SELECTED[0]]
    assert sums(col) == spooled_sums([SELECTED[0]])


@pytest.mark.parametrize("rule", ["median", "robust"])
def test_a_rule_that_judges_whole_updates_keeps_spooling_them(rule):
    """Order statistics hold every update; the default robust rule needs an update's whole norm
    before its clip factor is known: neither folds in place."""
    col = RoundCollector(1, SELECTED, TEMPLATE, aggregation=Aggregation(rule))
    st = Stream(col, SELECTED[0])
    st.finish()
    assert st.rx.sink is None
