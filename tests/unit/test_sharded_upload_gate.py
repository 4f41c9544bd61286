"""A site's update in per-rank shards, at the round gate: the layout, the assembly (equal to the
whole update bit for bit, whatever the arrival order), and an incomplete site counting for
nothing. The gRPC path and the refusals: tests/integration/test_sharded_upload_grpc.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from powertrip.learning.shards import shard_rows
from powertrip.services.aggregator.collector import RoundCollector
from powertrip.services.aggregator.delta_inbox import DeltaInbox
from powertrip.services.common.errors import Duplicate, StaleRound
from powertrip.services.common.tensor_receiver import TensorStreamReceiver
from powertrip.services.common.tensor_stream import (
    StreamError,
    encode,
    shard_of,
    shard_specs,
    specs_of,
)

TEMPLATE = {
    "emb": np.zeros((10, 3), np.float32),  # 4 shards: 3, 3, 3, 1 rows
    "bias": np.zeros(2, np.float32),  # 4 shards: 1, 1, 0, 0 rows
    "scale": np.zeros((), np.float32),  # whole, in shard 0 only
}
MODEL = specs_of(TEMPLATE)
SELECTED = [3, 0, 6]


def update(site: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(site)
    return {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in TEMPLATE.items()}


def stream(params, expected, bf16=False) -> TensorStreamReceiver:
    rx = TensorStreamReceiver(expected)
    parts = list(encode(params, 8, bf16))
    rx.header(parts[0])
    for c in parts[1:-1]:
        rx.chunk(c)
    rx.trailer(parts[-1])
    return rx


def send_shard(gate, site: int, index: int, count: int, weight: float | None = None) -> None:
    w = float(site + 1) if weight is None else weight
    gate.admit_shard(site, gate.round, index, count, w, MODEL)
    part = shard_of(update(site), count, index)
    gate.commit_shard(site, index, stream(part, shard_specs(MODEL, count, index)))


def send_whole(gate, site: int) -> None:
    gate.admit(site, gate.round)
    gate.commit(site, stream(update(site), MODEL), float(site + 1))


def folded(sites) -> dict[str, np.ndarray]:
    col = RoundCollector(1, sites, TEMPLATE)
    for s in sites:
        send_whole(col, s)
    col.close()
    return col.agg.apply(TEMPLATE)


def test_shards_are_row_ranges_and_a_0d_tensor_travels_in_shard_0():
    whole = update(1)
    for count in (1, 3, 4, 8):
        parts = [shard_of(whole, count, i) for i in range(count)]
        assert all(specs_of(p) == shard_specs(MODEL, count, i) for i, p in enumerate(parts))
        assert [("scale" in p) for p in parts] == [True] + [False] * (count - 1)
        for name in ("emb", "bias"):
            rows = [shard_rows(whole[name].shape[0], count, i) for i in range(count)]
            assert np.array_equal(np.concatenate([p[name] for p in parts]), whole[name])
            assert [p[name].shape[0] for p in parts] == [hi - lo for lo, hi in rows]


@pytest.mark.parametrize("count", [1, 4, 8])
def test_a_sharded_site_folds_bit_for_bit_as_its_whole_update(count):
    orders = itertools.islice(itertools.permutations(range(count)), 3)
    for order in orders:
        col = RoundCollector(1, SELECTED, TEMPLATE)
        send_whole(col, 3)
        for i in order:  # site 0's shards, in this arrival order, between two whole updates
            send_shard(col, 0, i, count)
        send_whole(col, 6)
        col.close()
        assert col.accepted == SELECTED
        got, want = col.agg.apply(TEMPLATE), folded(SELECTED)
        assert all(np.array_equal(got[k], want[k]) for k in TEMPLATE)


def test_bf16_shards_fold_as_bf16_whole_updates():
    col = RoundCollector(1, [0], TEMPLATE)
    for i in range(4):
        col.admit_shard(0, 1, i, 4, 1.0, MODEL)
        part = shard_of(update(0), 4, i)
        col.commit_shard(0, i, stream(part, shard_specs(MODEL, 4, i), bf16=True))
    ref = RoundCollector(1, [0], TEMPLATE)
    ref.admit(0, 1)
    ref.commit(0, stream(update(0), MODEL, bf16=True), 1.0)
    col.close()
    ref.close()
    got, want = col.agg.apply(TEMPLATE), ref.agg.apply(TEMPLATE)
    assert all(np.array_equal(got[k], want[k]) for k in TEMPLATE)


@pytest.mark.reliability("R31")
def test_a_site_missing_a_shard_contributes_nothing_when_the_round_closes():
    col = RoundCollector(1, SELECTED, TEMPLATE)
    send_whole(col, 3)
    for i in (0, 1, 3):  # shard 2 of 4 never comes
        send_shard(col, 0, i, 4)
    send_whole(col, 6)
    assert not col.wait(0.01)  # site 0 is still owed
    col.close()
    assert col.accepted == [3, 6] and col.failed == {0: "deadline"}
    got, want = col.agg.apply(TEMPLATE), folded([3, 6])
    assert all(np.array_equal(got[k], want[k]) for k in TEMPLATE)
    with pytest.raises(StaleRound):  # the missing shard, too late
        send_shard(col, 0, 2, 4)


@pytest.mark.reliability("R31")
def test_shard_headers_that_disagree_are_refused_and_duplicates_are_duplicates():
    col = RoundCollector(1, SELECTED, TEMPLATE)
    send_shard(col, 0, 0, 4)
    for index, count, weight, words in [
        (1, 2, 1.0, "say 4 shards"),
        (1, 4, 2.0, "differs"),
        (4, 4, 1.0, "out of range"),
        (0, 65, 1.0, "1 to 64"),
    ]:
        with pytest.raises(StreamError, match=words):
            col.admit_shard(0, 1, index, count, weight, MODEL)
    with pytest.raises(Duplicate, match="site-000 round 1 shard 0 of 4"):
        col.admit_shard(0, 1, 0, 4, 1.0, MODEL)
    with pytest.raises(Duplicate):  # a whole update while its shards arrive
        col.admit(0, 1)
    col.admit(3, 1)
    with pytest.raises(Duplicate):  # shards while its whole update streams
        col.admit_shard(3, 1, 0, 2, 4.0, MODEL)


def test_a_refused_first_shard_frees_the_sites_count():
    col = RoundCollector(1, SELECTED, TEMPLATE)
    col.admit_shard(0, 1, 0, 8, 1.0, MODEL)  # claims 8 shards, then fails verification
    col.fail_shard(0, 0, "shape")
    assert col.failed == {0: "shape"}
    for i in range(4):  # the site sends again, in 4
        send_shard(col, 0, i, 4)
    assert 0 not in col.failed


def test_curtailment_inbox_gets_a_sharded_site_whole():
    inbox = DeltaInbox(1, [0])
    for i in (2, 0, 1):
        send_shard(inbox, 0, i, 3)
    want = update(0)
    assert all(np.array_equal(inbox.deltas[0][k], want[k]) for k in TEMPLATE)
    assert inbox.weights[0] == 1.0
