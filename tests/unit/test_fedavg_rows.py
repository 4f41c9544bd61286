"""A batched round folds as one weighted reduction (``add_rows``): the same model and statistics
as adding each row in turn, within float32 rounding (bit for bit with a float64 accumulator)."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.aggregation.fedavg import (
    StreamingFedAvg,
    UpdateRejected,
    delta_sketch,
    sketch_stride,
)
from powertrip.aggregation.robust import Aggregation

SHAPES = {"conv.weight": (24, 1, 5), "conv.bias": (24,), "head.weight": (10, 240), "one": (1,)}


def stacked_round(k: int, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Rows whose magnitudes span 16 decades: any change of summation order shows."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in SHAPES.items():
        scale = rng.choice([1e-8, 1.0, 1e8], size=(k, *shape))
        out[name] = (rng.standard_normal((k, *shape)) * scale).astype(dtype)
    return out


def template(dtype=np.float32) -> dict[str, np.ndarray]:
    return {n: np.zeros(s, dtype=dtype) for n, s in SHAPES.items()}


def direction() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    new = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    return delta_sketch(new, template(), sketch_stride(new))


def fold_one_by_one(agg, stacked, weights):
    for j, w in enumerate(weights):
        agg.add({n: a[j] for n, a in stacked.items()}, float(w))
    return agg


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def close(a: np.ndarray, b: np.ndarray, terms: np.ndarray) -> None:
    """Equal within float32 rounding of a sum: relative to the sum of the terms' magnitudes."""
    np.testing.assert_allclose(a, b, rtol=0, atol=float(np.abs(terms).sum(0).max()) * 1e-6)


def normal_round(k: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal((k, *s)).astype(np.float32) for n, s in SHAPES.items()}


@pytest.mark.parametrize("k", [1, 2, 7, 100, 1000])
def test_add_rows_equals_adding_each_row_in_turn_within_float32_rounding(k):
    stacked = normal_round(k, seed=k)
    weights = np.random.default_rng(k).integers(1, 300, size=k).astype(float)
    rows = StreamingFedAvg(template(), direction=direction())
    rows.add_rows(stacked, weights)
    each = fold_one_by_one(StreamingFedAvg(template(), direction=direction()), stacked, weights)
    for name in SHAPES:
        terms = stacked[name] * (weights / weights.sum()).reshape(-1, *[1] * len(SHAPES[name]))
        close(rows.mean_delta()[name], each.mean_delta()[name], terms)
    np.testing.assert_allclose(rows.dispersion(), each.dispersion(), rtol=1e-5)
    np.testing.assert_allclose(rows.projection(), each.projection(), rtol=1e-4, atol=1e-6)
    assert (rows.count, rows.total_weight) == (each.count, each.total_weight)


def test_a_float64_accumulator_adds_the_rows_in_turn_bit_for_bit():
    """Magnitudes spanning 16 decades: any change of summation order would show."""
    stacked = stacked_round(50, seed=11)
    weights = np.random.default_rng(1).integers(1, 300, size=50).astype(float)
    rows = StreamingFedAvg(template(), accumulate_dtype=np.float64)
    rows.add_rows(stacked, weights)
    each = fold_one_by_one(
        StreamingFedAvg(template(), accumulate_dtype=np.float64), stacked, weights
    )
    assert all(same_bits(rows._sum[n], each._sum[n]) for n in SHAPES)


def test_add_rows_continues_a_sum_already_started_in_the_same_order():
    stacked = normal_round(9, seed=3)
    weights = np.arange(1.0, 10.0)
    first = {n: a[:4] for n, a in stacked.items()}
    rest = {n: a[4:] for n, a in stacked.items()}
    rows = StreamingFedAvg(template())
    rows.add_rows(first, weights[:4])
    rows.add_rows(rest, weights[4:])
    each = fold_one_by_one(StreamingFedAvg(template()), stacked, weights)
    assert rows.count == 9
    for n in SHAPES:
        close(rows.mean_delta()[n], each.mean_delta()[n], stacked[n])


def test_every_other_row_as_a_strided_view_folds_like_those_rows_copied():
    """The emulator's split-half probe folds rows 0, 2, 4, ... of the same stacked arrays."""
    stacked = normal_round(11, seed=5)
    weights = np.linspace(1.0, 3.0, 11)
    view = StreamingFedAvg(template())
    view.add_rows({n: a[::2] for n, a in stacked.items()}, weights[::2])
    copied = fold_one_by_one(
        StreamingFedAvg(template()), {n: a[::2].copy() for n, a in stacked.items()}, weights[::2]
    )
    for n in SHAPES:
        close(view.mean_delta()[n], copied.mean_delta()[n], stacked[n])


def test_a_fold_block_smaller_than_a_tensor_changes_no_bit(monkeypatch):
    import powertrip.aggregation.fedavg as fedavg

    stacked = stacked_round(30, seed=13)
    weights = np.arange(1.0, 31.0)
    whole = StreamingFedAvg(template(), accumulate_dtype=np.float64)
    whole.add_rows(stacked, weights)
    monkeypatch.setattr(fedavg, "FOLD_BLOCK", 64)  # tensors of up to 2,400 values: many blocks
    blocked = StreamingFedAvg(template(), accumulate_dtype=np.float64)
    blocked.add_rows(stacked, weights)
    assert all(same_bits(whole._sum[n], blocked._sum[n]) for n in SHAPES)


def test_a_non_finite_row_is_refused_naming_its_tensor_before_anything_is_folded():
    stacked = stacked_round(5)
    stacked["head.weight"][3, 2, 7] = np.nan
    agg = StreamingFedAvg(template())
    with pytest.raises(UpdateRejected, match="'head.weight' contains NaN") as info:
        agg.add_rows(stacked, np.ones(5))
    assert info.value.reason == "non_finite"
    assert agg.count == 0 and all(not a.any() for a in agg._sum.values())


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_a_bad_weight_is_refused_like_add_refuses_it(bad):
    weights = np.ones(4)
    weights[2] = bad
    with pytest.raises(UpdateRejected) as info:
        StreamingFedAvg(template()).add_rows(stacked_round(4), weights)
    assert info.value.reason == "bad_weight"


def test_a_robust_rule_folds_rows_one_by_one_with_the_same_result():
    stacked = stacked_round(6, seed=2)
    weights = np.arange(1.0, 7.0)
    rule = Aggregation(rule="median")
    rows = rule.make(template())
    rows.add_rows(stacked, weights)
    each = fold_one_by_one(rule.make(template()), stacked, weights)
    new_rows, new_each = rows.apply(template()), each.apply(template())
    assert all(same_bits(new_rows[n], new_each[n]) for n in SHAPES)
