"""A round whose rows are one [sites, parameters] matrix (the emulator trainer's buffer) folds
through whole-matrix products: recognised from the tensor views alone, the same model and
statistics as folding each row in turn within float32 rounding, and refused alike when bad."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from powertrip.aggregation.fedavg import (
    StreamingFedAvg,
    UpdateRejected,
    delta_sketch,
    sketch_stride,
)
from powertrip.aggregation.fold_rows import dense_direction, shared_matrix
from powertrip.learning.device import host_rows, to_numpy

SHAPES = {"conv.weight": (24, 1, 5), "conv.bias": (24,), "head.weight": (10, 240), "one": (1,)}


def matrix_round(k: int, seed: int = 0) -> dict[str, np.ndarray]:
    """k rows laid out as the trainer lays them out: column blocks of one matrix."""
    params = {n: torch.zeros(s) for n, s in SHAPES.items()}
    rows = host_rows(params, k)
    gen = torch.Generator().manual_seed(seed)
    for d in rows.values():
        d.copy_(torch.randn(d.shape, generator=gen))
    return to_numpy(rows)


def template() -> dict[str, np.ndarray]:
    return {n: np.zeros(s, dtype=np.float32) for n, s in SHAPES.items()}


def direction() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    new = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    return delta_sketch(new, template(), sketch_stride(new))


def fold_one_by_one(agg, stacked, weights):
    for j, w in enumerate(weights):
        agg.add({n: np.ascontiguousarray(a[j]) for n, a in stacked.items()}, float(w))
    return agg


def test_the_trainers_round_buffer_is_seen_as_one_matrix_and_so_are_every_other_rows():
    stacked = matrix_round(6)
    whole = shared_matrix(stacked, list(SHAPES))
    assert whole is not None and whole.shape == (6, 24 * 5 + 24 + 2400 + 1)
    np.testing.assert_array_equal(whole[3, 120:144], stacked["conv.bias"][3])
    half = shared_matrix({n: a[::2] for n, a in stacked.items()}, list(SHAPES))
    assert half is not None and half.shape == (3, whole.shape[1])
    np.testing.assert_array_equal(half[1], whole[2])


def test_rows_laid_out_any_other_way_are_not_taken_for_a_matrix():
    stacked = matrix_round(4)
    separate = {n: a.copy() for n, a in stacked.items()}
    assert shared_matrix(separate, list(SHAPES)) is None
    assert shared_matrix(stacked, list(reversed(SHAPES))) is None  # blocks out of order
    assert (
        shared_matrix({**stacked, "one": stacked["one"].astype(np.float64)}, list(SHAPES)) is None
    )
    square = np.zeros((4, 5, 5), dtype=np.float32)
    assert shared_matrix({"t": square.transpose(0, 2, 1)}, ["t"]) is None  # rows not C-ordered


@pytest.mark.parametrize("k", [1, 2, 7, 100])
def test_a_matrix_round_folds_like_adding_each_row_in_turn(k):
    stacked = matrix_round(k, seed=k)
    weights = np.random.default_rng(k).integers(1, 300, size=k).astype(float)
    rows = StreamingFedAvg(template(), direction=direction())
    sq = rows.add_rows(stacked, weights)
    each = fold_one_by_one(StreamingFedAvg(template(), direction=direction()), stacked, weights)
    for name in SHAPES:
        scale = float(np.abs(stacked[name]).sum(0).max()) / weights.size * 1e-5
        np.testing.assert_allclose(
            rows.mean_delta()[name], each.mean_delta()[name], rtol=0, atol=scale
        )
    per_row = sum(np.square(a.reshape(k, -1).astype(np.float64)).sum(1) for a in stacked.values())
    np.testing.assert_allclose(sq, per_row, rtol=1e-5)
    np.testing.assert_allclose(rows.dispersion(), each.dispersion(), rtol=1e-5)
    np.testing.assert_allclose(rows.projection(), each.projection(), rtol=1e-4, atol=1e-6)
    assert (rows.count, rows.total_weight) == (each.count, each.total_weight)


def test_the_split_half_probe_over_the_matrix_reuses_the_norms_and_folds_every_other_row():
    stacked = matrix_round(11, seed=5)
    weights = np.linspace(1.0, 3.0, 11)
    sq = StreamingFedAvg(template()).add_rows(stacked, weights)
    half = StreamingFedAvg(template())
    half.add_rows({n: a[::2] for n, a in stacked.items()}, weights[::2], sq[::2])
    copied = fold_one_by_one(
        StreamingFedAvg(template()), {n: a[::2] for n, a in stacked.items()}, weights[::2]
    )
    for n in SHAPES:
        np.testing.assert_allclose(half.mean_delta()[n], copied.mean_delta()[n], atol=1e-6)
    np.testing.assert_allclose(half.dispersion(), copied.dispersion(), rtol=1e-5)


def test_a_non_finite_row_of_a_matrix_is_refused_naming_its_tensor_and_nothing_is_folded():
    stacked = matrix_round(5)
    stacked["head.weight"][3, 2, 7] = np.nan
    agg = StreamingFedAvg(template())
    with pytest.raises(UpdateRejected, match="head.weight"):
        agg.add_rows(stacked, np.ones(5))
    assert agg.count == 0 and all(not a.any() for a in agg._sum.values())


def test_the_dense_direction_holds_the_sketch_at_every_strided_coordinate_and_zeros_elsewhere():
    sketch = {n: np.arange(1, -(-np.prod(s) // 3) + 1, dtype=np.float32) for n, s in SHAPES.items()}
    dense = dense_direction(sketch, SHAPES, 3, np.dtype(np.float32))
    off = 0
    for name, shape in SHAPES.items():
        block = dense[off : off + int(np.prod(shape))]
        np.testing.assert_array_equal(block[::3], sketch[name][: block[::3].size])
        assert not np.delete(block, np.arange(0, block.size, 3)).any()
        off += block.size
