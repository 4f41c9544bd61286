"""Streaming FedAvg (Eq. 2): the weighted mean, every rejection, apply() and dispersion()."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from powertrip.aggregation.fedavg import StreamingFedAvg, UpdateRejected


def template(dtype=np.float64) -> dict[str, np.ndarray]:
    return {"w": np.zeros(2, dtype=dtype), "b": np.zeros(1, dtype=dtype)}


def delta(w, b, dtype=np.float64) -> dict[str, np.ndarray]:
    return {"w": np.array(w, dtype=dtype), "b": np.array(b, dtype=dtype)}


def two_sites() -> StreamingFedAvg:
    """Site A (weight 1): w = [1, 2], b = [0]; site B (weight 3): w = [5, 6], b = [2]."""
    agg = StreamingFedAvg(template())
    agg.add(delta([1.0, 2.0], [0.0]), 1.0)
    agg.add(delta([5.0, 6.0], [2.0]), 3.0)
    return agg


# -------------------------------------------------------------------------------- Eq. 2


def test_mean_delta_is_the_sample_weighted_mean():
    # Prepare / Execute
    mean = two_sites().mean_delta()

    # Assert: w = (1*[1, 2] + 3*[5, 6]) / 4 = [16, 20] / 4 = [4, 5]; b = (0 + 3*2) / 4 = 1.5
    assert mean["w"] == pytest.approx([4.0, 5.0])
    assert mean["b"] == pytest.approx([1.5])


def test_apply_adds_the_weighted_mean_delta_to_the_global_model():
    # Prepare
    agg = two_sites()
    global_params = {"w": np.array([10.0, 10.0]), "b": np.array([-1.0])}

    # Execute
    new = agg.apply(global_params)

    # Assert: [10, 10] + [4, 5] = [14, 15]; -1 + 1.5 = 0.5; the input model is not modified
    assert new["w"] == pytest.approx([14.0, 15.0])
    assert new["b"] == pytest.approx([0.5])
    assert global_params["w"].tolist() == [10.0, 10.0]


def test_equal_weights_give_the_plain_mean():
    # three sites of 10 samples each: w = ([3, 0] + [0, 3] + [0, 0]) / 3 = [1, 1]
    agg = StreamingFedAvg(template())
    for w in ([3.0, 0.0], [0.0, 3.0], [0.0, 0.0]):
        agg.add(delta(w, [0.0]), 10.0)
    assert agg.mean_delta()["w"] == pytest.approx([1.0, 1.0])
    assert (agg.count, agg.total_weight) == (3, 30.0)


def test_only_relative_weights_matter():
    # weights 1 and 3 or 100 and 300: the same mean
    agg = StreamingFedAvg(template())
    agg.add(delta([1.0, 2.0], [0.0]), 100.0)
    agg.add(delta([5.0, 6.0], [2.0]), 300.0)
    assert agg.mean_delta()["w"] == pytest.approx([4.0, 5.0])


def test_mean_keeps_the_model_dtype_when_accumulating_in_float64():
    # Prepare: float32 model, float64 accumulator
    agg = StreamingFedAvg(template(np.float32), accumulate_dtype=np.float64)
    agg.add(delta([1.0, 2.0], [0.0], np.float32), 1.0)
    agg.add(delta([5.0, 6.0], [2.0], np.float32), 3.0)

    # Execute
    mean = agg.mean_delta()

    # Assert
    assert mean["w"].dtype == np.float32 and mean["b"].dtype == np.float32
    assert mean["w"] == pytest.approx([4.0, 5.0])


def test_an_empty_round_has_no_mean_and_no_dispersion():
    agg = StreamingFedAvg(template())
    with pytest.raises(ValueError, match="no update was aggregated"):
        agg.mean_delta()
    with pytest.raises(ValueError, match="no update was aggregated"):
        agg.apply(template())
    with pytest.raises(ValueError, match="no update was aggregated"):
        agg.dispersion()


# -------------------------------------------------------------------------------- rejections


def wrong_shape():
    return {"w": np.zeros(2), "b": np.zeros(2)}


def wrong_dtype():
    return {"w": np.zeros(2), "b": np.zeros(1, dtype=np.float32)}


def missing_tensor():
    return {"w": np.zeros(2)}


def extra_tensor():
    return {"w": np.zeros(2), "b": np.zeros(1), "c": np.zeros(3)}


def with_nan():
    return {"w": np.zeros(2), "b": np.array([np.nan])}


def with_inf():
    return {"w": np.zeros(2), "b": np.array([np.inf])}


def with_negative_inf():
    return {"w": np.zeros(2), "b": np.array([-np.inf])}


@pytest.mark.parametrize(
    ("make_delta", "reason", "message"),
    [
        (wrong_shape, "shape", r"tensor 'b' has shape \(2,\), expected \(1,\)"),
        (wrong_dtype, "dtype", "tensor 'b' has dtype float32, expected float64"),
        (missing_tensor, "tensor_set", r"missing \['b'\]"),
        (extra_tensor, "tensor_set", r"unexpected \['c'\]"),
        (with_nan, "non_finite", "tensor 'b' contains NaN or Inf"),
        (with_inf, "non_finite", "tensor 'b' contains NaN or Inf"),
        (with_negative_inf, "non_finite", "tensor 'b' contains NaN or Inf"),
    ],
)
def test_a_malformed_update_is_rejected_naming_the_tensor(make_delta, reason, message):
    # Prepare
    agg = StreamingFedAvg(template())

    # Execute
    with pytest.raises(UpdateRejected, match=message) as exc:
        agg.add(make_delta(), 1.0)

    # Assert
    assert exc.value.reason == reason
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize("bad_weight", [0.0, -1.0, float("nan"), float("inf"), float("-inf")])
def test_an_update_with_a_bad_weight_is_rejected(bad_weight):
    agg = StreamingFedAvg(template())
    with pytest.raises(UpdateRejected, match="weight must be finite and > 0") as exc:
        agg.add(delta([1.0, 2.0], [0.0]), bad_weight)
    assert exc.value.reason == "bad_weight"


@pytest.mark.reliability("R11", "R12")
@pytest.mark.parametrize(
    ("make_delta", "weight"),
    [
        (wrong_shape, 1.0),
        (wrong_dtype, 1.0),
        (missing_tensor, 1.0),
        (extra_tensor, 1.0),
        (with_nan, 1.0),
        (lambda: delta([1.0, 2.0], [0.0]), 0.0),
        (lambda: delta([1.0, 2.0], [0.0]), float("nan")),
    ],
    ids=["shape", "dtype", "missing", "extra", "nan", "zero-weight", "nan-weight"],
)
def test_a_rejected_update_leaves_the_accumulator_unchanged(make_delta, weight):
    # Prepare: two good updates; 'w' of the bad ones is fine, only 'b' (checked last) or the
    # weight is wrong, so nothing may be folded in before the problem is found
    agg = two_sites()
    before = (agg.mean_delta(), agg.dispersion(), agg.count, agg.total_weight)

    # Execute
    with pytest.raises(UpdateRejected):
        agg.add(make_delta(), weight)

    # Assert
    mean, dispersion, count, total = agg.mean_delta(), agg.dispersion(), agg.count, agg.total_weight
    assert (count, total) == (before[2], before[3]) == (2, 4.0)
    assert mean["w"].tolist() == before[0]["w"].tolist() == [4.0, 5.0]
    assert mean["b"].tolist() == before[0]["b"].tolist() == [1.5]
    assert dispersion == before[1]


def test_validate_alone_never_touches_the_accumulator():
    agg = StreamingFedAvg(template())
    agg.validate(delta([1.0, 2.0], [0.0]), 1.0)
    assert (agg.count, agg.total_weight) == (0, 0.0)


@pytest.mark.reliability("R12")
def test_apply_refuses_a_non_finite_result():
    # Prepare: float32 model near its maximum (3.4e38); each input is finite, the sum is not
    agg = StreamingFedAvg({"w": np.zeros(1, dtype=np.float32)})
    agg.add({"w": np.array([3e38], dtype=np.float32)}, 1.0)
    global_params = {"w": np.array([3e38], dtype=np.float32)}

    # Execute / Assert
    with np.errstate(over="ignore"), pytest.raises(UpdateRejected, match="not finite") as exc:
        agg.apply(global_params)
    assert exc.value.reason == "non_finite"


# -------------------------------------------------------------------------------- dispersion


def test_dispersion_on_a_hand_made_round():
    # Prepare / Execute
    mean_sq, sq_of_mean, k_eff = two_sites().dispersion()

    # Assert:
    #   |A|^2 = 1 + 4 + 0 = 5, |B|^2 = 25 + 36 + 4 = 65 -> weighted mean (1*5 + 3*65) / 4 = 50
    #   mean = ([4, 5], [1.5]) -> |mean|^2 = 16 + 25 + 2.25 = 43.25
    #   k_eff = (1 + 3)^2 / (1^2 + 3^2) = 16 / 10 = 1.6
    assert mean_sq == pytest.approx(50.0)
    assert sq_of_mean == pytest.approx(43.25)
    assert k_eff == pytest.approx(1.6)


def test_dispersion_gap_is_the_weighted_spread_around_the_mean():
    # weighted mean |d_i - mean|^2 = (1 * |[-3,-3,-1.5]|^2 + 3 * |[1,1,0.5]|^2) / 4
    #                              = (20.25 + 3 * 2.25) / 4 = 6.75 = 50 - 43.25
    mean_sq, sq_of_mean, _ = two_sites().dispersion()
    assert mean_sq - sq_of_mean == pytest.approx(6.75)


def test_identical_updates_have_no_spread_and_count_as_all_sites():
    agg = StreamingFedAvg(template())
    for _ in range(4):
        agg.add(delta([3.0, 4.0], [0.0]), 5.0)
    mean_sq, sq_of_mean, k_eff = agg.dispersion()
    assert mean_sq == pytest.approx(25.0)
    assert sq_of_mean == pytest.approx(25.0)
    assert k_eff == pytest.approx(4.0)


# ------------------------------------------------------------------------------------ memory


def test_it_does_not_keep_references_to_added_arrays():
    # Prepare
    agg = StreamingFedAvg(template())
    update = delta([1.0, 2.0], [0.0])
    refs = [weakref.ref(a) for a in update.values()]

    # Execute
    agg.add(update, 1.0)
    del update
    gc.collect()

    # Assert
    assert all(r() is None for r in refs)


def test_mutating_an_update_after_adding_it_does_not_change_the_result():
    # Prepare
    agg = StreamingFedAvg(template())
    update = delta([1.0, 2.0], [0.5])
    agg.add(update, 2.0)

    # Execute
    update["w"][:] = 1000.0
    update["b"][:] = np.nan

    # Assert
    assert agg.mean_delta()["w"].tolist() == [1.0, 2.0]
    assert agg.mean_delta()["b"].tolist() == [0.5]
    assert agg.dispersion()[0] == pytest.approx(5.25)  # 1 + 4 + 0.25


def test_mutating_the_template_after_construction_does_not_change_the_result():
    params = template()
    agg = StreamingFedAvg(params)
    params["w"][:] = 7.0
    agg.add(delta([1.0, 2.0], [0.0]), 1.0)
    assert agg.mean_delta()["w"].tolist() == [1.0, 2.0]


# ------------------------------------------------------------- projection on a direction


def two_sites_along(direction) -> StreamingFedAvg:
    agg = StreamingFedAvg(template(), direction=direction)
    agg.add(delta([1.0, 2.0], [0.0]), 1.0)
    agg.add(delta([5.0, 6.0], [2.0]), 3.0)
    return agg


def test_projection_on_a_hand_made_round():
    # Prepare: u = ([3, 0], [4]), |u| = 5 -> unit ([0.6, 0], [0.8])
    agg = two_sites_along(delta([3.0, 0.0], [4.0]))

    # Execute
    mean_proj, mean_sq_proj = agg.projection()

    # Assert:
    #   p_A = 0.6 * 1 = 0.6, p_B = 0.6 * 5 + 0.8 * 2 = 4.6
    #   weighted mean (0.6 + 3 * 4.6) / 4 = 3.6 (= mean delta ([4, 5], [1.5]) . u = 2.4 + 1.2)
    #   weighted mean of squares (0.36 + 3 * 21.16) / 4 = 15.96
    assert mean_proj == pytest.approx(3.6)
    assert mean_sq_proj == pytest.approx(15.96)


def test_projection_does_not_depend_on_the_length_of_the_direction():
    short = two_sites_along(delta([3.0, 0.0], [4.0])).projection()
    long = two_sites_along(delta([300.0, 0.0], [400.0])).projection()
    assert long == pytest.approx(short)


@pytest.mark.parametrize(
    "direction", [None, delta([0.0, 0.0], [0.0])], ids=["no-direction", "zero-direction"]
)
def test_without_a_usable_direction_there_is_no_projection(direction):
    assert two_sites_along(direction).projection() is None


def test_a_direction_that_does_not_match_the_model_is_refused():
    with pytest.raises(ValueError, match="direction"):
        StreamingFedAvg(template(), direction={"w": np.ones(3), "b": np.ones(1)})


def test_sliced_updates_give_the_same_projection_as_whole_ones():
    u = delta([3.0, 0.0], [4.0])
    whole = two_sites_along(u)
    sliced = StreamingFedAvg(template(), direction=u)
    for w, b, weight in (([1.0, 2.0], [0.0], 1.0), ([5.0, 6.0], [2.0], 3.0)):
        d = delta(w, b)
        pieces = [("w", 1, d["w"][1:]), ("b", 0, d["b"]), ("w", 0, d["w"][:1])]
        sliced.add_pieces(pieces, weight)
    assert sliced.projection() == pytest.approx(whole.projection())


def test_a_large_model_projects_on_a_strided_sketch_of_the_direction(monkeypatch):
    """Above SKETCH_MAX coordinates only every stride-th one is kept: projections are those of
    the updates restricted to the sketch, however the update arrives in slices."""
    import powertrip.aggregation.fedavg as fedavg
    import powertrip.aggregation.fold_inputs as fold_inputs

    monkeypatch.setattr(fold_inputs, "SKETCH_MAX", 4)
    rng = np.random.default_rng(0)
    tmpl = {"w": np.zeros((3, 5), np.float32), "b": np.zeros(7, np.float32)}  # 22 -> stride 6
    assert fedavg.sketch_stride(tmpl) == 6
    old = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in tmpl.items()}
    new = {k: v + rng.standard_normal(v.shape).astype(np.float32) for k, v in old.items()}
    sketch = fedavg.delta_sketch(new, old, 6)
    assert [v.size for v in sketch.values()] == [3, 2]  # coordinates 0, 6, 12 and 0, 6
    d = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in tmpl.items()}
    whole = StreamingFedAvg(tmpl, direction=sketch)
    whole.add(d, 1.0)
    sliced = StreamingFedAvg(tmpl, direction=sketch)
    flat = d["w"].reshape(-1)
    pieces = [("w", 0, flat[:4]), ("w", 4, flat[4:11]), ("w", 11, flat[11:]), ("b", 0, d["b"])]
    sliced.add_pieces(pieces, 1.0)
    u = np.concatenate([(new[k] - old[k]).reshape(-1)[::6] for k in ("w", "b")])
    sampled = np.concatenate([d[k].reshape(-1)[::6] for k in ("w", "b")])
    expected = float(np.vdot(u, sampled)) / float(np.linalg.norm(u))
    assert whole.projection()[0] == pytest.approx(expected, rel=1e-6)
    assert sliced.projection() == pytest.approx(whole.projection(), rel=1e-6)


@pytest.mark.parametrize(("update", "accumulate"), [(np.float32, None), (np.float32, np.float64)])
def test_a_tensor_larger_than_a_fold_block_folds_bit_for_bit_as_one_expression(update, accumulate):
    """The fold multiplies and adds block by block (a cache-sized temporary); the sum must be
    the very bits of ``acc += w * delta`` on the whole tensor."""
    from powertrip.aggregation.fedavg import FOLD_BLOCK

    rng = np.random.default_rng(0)
    template = {"w": np.zeros(2 * FOLD_BLOCK + 12_345, dtype=update)}
    deltas = [rng.standard_normal(template["w"].size).astype(update) for _ in range(3)]
    weights = [0.37, 12.0, 3.1]
    agg = StreamingFedAvg(template, accumulate_dtype=accumulate)
    want = np.zeros(template["w"].size, dtype=accumulate or update)
    for d, w in zip(deltas, weights, strict=True):
        agg.add({"w": d}, w)
        want += w * d
    assert np.array_equal(agg._sum["w"], want)


def test_a_large_updates_squared_norm_keeps_float32_partial_sums_short():
    """One float32 dot product over millions of values drifts (2e-5 at 4 M values, 1.5e-3 at
    64 M); blocked partial sums summed as floats stay at float32's own precision."""
    from powertrip.aggregation.fold_inputs import sq_norm

    a = np.random.default_rng(1).standard_normal(1 << 22, dtype=np.float32) * 0.01
    exact = float(np.dot(a.astype(np.float64), a.astype(np.float64)))
    assert sq_norm(a) == pytest.approx(exact, rel=2e-6)


def test_validation_and_a_streamed_fold_measure_the_same_norm():
    """``add`` takes the update's squared norm from its validation, ``add_pieces`` while it
    folds: the same blocks, so the same dispersion, bit for bit, above one block too."""
    from powertrip.aggregation.fedavg import FOLD_BLOCK

    rng = np.random.default_rng(2)
    template = {"w": np.zeros(FOLD_BLOCK + 999, np.float32), "b": np.zeros(7, np.float32)}
    deltas = [
        {k: rng.standard_normal(v.size).astype(np.float32) for k, v in template.items()}
        for _ in range(3)
    ]
    whole, streamed = StreamingFedAvg(template), StreamingFedAvg(template)
    for j, d in enumerate(deltas):
        whole.add(d, float(j + 1))
        streamed.add_pieces([(k, 0, d[k]) for k in template], float(j + 1))
    assert whole.dispersion() == streamed.dispersion()
    assert all(np.array_equal(whole._sum[k], streamed._sum[k]) for k in template)
