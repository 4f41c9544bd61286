"""An update folded piece by piece as it arrives: the same sums as folding it whole, and a
rollback that leaves the sums bit for bit as they were."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.aggregation.fedavg import StreamingFedAvg, delta_sketch, sketch_stride
from powertrip.aggregation.fold_in_place import FoldCancelled, InPlaceFold

TEMPLATE = {
    "w": np.zeros((37, 11), np.float32),
    "b": np.zeros(5, np.float32),
    "s": np.zeros((), np.float32),
}


def delta(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in TEMPLATE.items()}


def pieces(update: dict[str, np.ndarray], step: int):
    for name, a in update.items():
        flat = a.reshape(-1)
        for i in range(0, max(flat.size, 1), step):
            yield name, i, flat[i : i + step]


def sums(agg: StreamingFedAvg) -> dict[str, bytes]:
    return {k: agg.region(k, 0, v.size).tobytes() for k, v in TEMPLATE.items()}


def direction() -> dict[str, np.ndarray]:
    return delta_sketch(delta(99), TEMPLATE, sketch_stride(TEMPLATE))


@pytest.mark.parametrize("step", [1, 7, 64, 10_000])
def test_folding_piece_by_piece_equals_folding_the_update_whole(step):
    whole = StreamingFedAvg(TEMPLATE, direction=direction())
    moving = StreamingFedAvg(TEMPLATE, direction=direction())
    for seed, weight in ((1, 3.0), (2, 5.0)):
        whole.add_pieces(pieces(delta(seed), 1 << 20), weight)
        fold = InPlaceFold([moving], weight)
        for name, start, values in pieces(delta(seed), step):
            fold.add(name, start, values)
        fold.commit()
    assert sums(moving) == sums(whole)
    assert moving.total_weight == whole.total_weight and moving.count == 2
    np.testing.assert_allclose(moving.dispersion(), whole.dispersion(), rtol=1e-6)
    np.testing.assert_allclose(moving.projection(), whole.projection(), rtol=1e-6)


@pytest.mark.parametrize("folded_pieces", [0, 1, 5, 60])
def test_a_rolled_back_fold_leaves_the_sums_as_they_were_bit_for_bit(folded_pieces):
    agg, half = StreamingFedAvg(TEMPLATE), StreamingFedAvg(TEMPLATE)
    agg.add_pieces(pieces(delta(1), 1 << 20), 2.0)
    half.add_pieces(pieces(delta(1), 1 << 20), 2.0)
    before, before_half = sums(agg), sums(half)
    fold = InPlaceFold([agg, half], 7.0)
    for name, start, values in list(pieces(delta(2), 7))[:folded_pieces]:
        fold.add(name, start, values)
    if folded_pieces:
        assert sums(agg) != before  # it did fold into the sums
    fold.rollback()
    assert sums(agg) == before and sums(half) == before_half
    assert agg.count == 1 and agg.total_weight == 2.0
    fold.rollback()  # idempotent
    assert sums(agg) == before


def test_pieces_after_a_rollback_are_refused_and_leave_the_sums_alone():
    agg = StreamingFedAvg(TEMPLATE)
    fold = InPlaceFold([agg], 1.0)
    fold.add("b", 0, delta(3)["b"])
    fold.rollback()
    with pytest.raises(FoldCancelled):
        fold.add("w", 0, delta(3)["w"].reshape(-1))
    with pytest.raises(FoldCancelled):
        fold.commit()
    assert agg.count == 0
    assert not any(np.frombuffer(v, np.float32).any() for v in sums(agg).values())


def test_a_committed_fold_counts_once_in_every_target_and_cannot_be_rolled_back():
    agg, half = StreamingFedAvg(TEMPLATE), StreamingFedAvg(TEMPLATE)
    fold = InPlaceFold([agg, half], 4.0)
    for name, start, values in pieces(delta(5), 13):
        fold.add(name, start, values)
    fold.commit()
    after = sums(agg)
    fold.rollback()  # a no-op once committed
    assert sums(agg) == after == sums(half)
    assert agg.count == half.count == 1
    assert agg.dispersion() == half.dispersion()
