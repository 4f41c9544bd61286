"""Every aggregation path is overflow-safe whatever weight a caller passes (reliability R26):
weights are bounded once (``fold_inputs.weight_problem``), the round's statistics use products
that give inf instead of raising, and the outer step refuses a step that would overflow."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.aggregation.fedavg import StreamingFedAvg, UpdateRejected
from powertrip.aggregation.fold_inputs import MAX_WEIGHT, weight_problem
from powertrip.aggregation.outer_step import NesterovOuter
from powertrip.aggregation.robust import make_aggregator

TEMPLATE = {"w": np.zeros((3, 4), np.float32), "b": np.zeros(4, np.float32)}
ABSURD = [1e300, MAX_WEIGHT * 2, float("inf"), float("nan"), 0.0, -1.0, 5e-324]


def update(value: float) -> dict[str, np.ndarray]:
    return {k: np.full_like(v, value) for k, v in TEMPLATE.items()}


def rules():
    return [
        StreamingFedAvg(TEMPLATE),
        StreamingFedAvg(TEMPLATE, accumulate_dtype=np.float64),
        make_aggregator("trimmed-mean", TEMPLATE, trim_beta=0.2),
        make_aggregator("median", TEMPLATE, clip_norm=1.0),
    ]


@pytest.mark.reliability("R26")
@pytest.mark.parametrize("weight", ABSURD)
def test_every_rule_refuses_an_absurd_weight_before_touching_its_sums(weight):
    for agg in rules():
        with pytest.raises(UpdateRejected) as exc:
            agg.add(update(0.1), weight)
        assert exc.value.reason == "bad_weight"
        assert agg.count == 0 and agg.total_weight == 0.0


@pytest.mark.reliability("R26")
def test_a_batched_fold_refuses_an_absurd_row_and_names_it():
    agg = StreamingFedAvg(TEMPLATE)
    stacked = {k: np.stack([v + 0.1, v + 0.2]) for k, v in TEMPLATE.items()}
    with pytest.raises(UpdateRejected, match="1e\\+300"):
        agg.add_rows(stacked, [10.0, 1e300])
    assert agg.count == 0


@pytest.mark.reliability("R26")
def test_the_largest_accepted_weights_keep_every_statistic_finite():
    agg = StreamingFedAvg(TEMPLATE)
    agg.add(update(0.1), MAX_WEIGHT)
    agg.add(update(0.3), MAX_WEIGHT)
    agg.add(update(0.2), 1.0)
    mean_sq, sq_of_mean, k_eff = agg.dispersion()
    assert np.isfinite([mean_sq, sq_of_mean, k_eff]).all()
    assert k_eff == pytest.approx(2.0)
    new = agg.apply(TEMPLATE)
    assert all(np.allclose(v, 0.2, atol=1e-6) for v in new.values())


def test_weight_problem_accepts_ordinary_counts_and_fractions():
    for ok in (1.0, 128.0, 0.5, 1e-300, MAX_WEIGHT):
        assert weight_problem(ok) is None
    for bad in ABSURD:
        assert weight_problem(bad) is not None


@pytest.mark.reliability("R26")
def test_an_outer_step_that_would_overflow_is_refused_and_keeps_its_momentum():
    outer = NesterovOuter(lr=0.7, momentum=0.9)
    previous = {"w": np.zeros(4, np.float32)}
    first = outer.step(previous, {"w": np.full(4, -0.1, np.float32)})
    assert np.isfinite(first["w"]).all()
    momentum = {k: v.copy() for k, v in outer._m.items()}
    huge = {"w": np.full(4, -3e38, np.float32)}  # finite, but 0.7 * 1.9 * 3e38 is not
    with pytest.raises(UpdateRejected) as exc:
        outer.step(first, huge)
    assert exc.value.reason == "non_finite"
    assert all(np.array_equal(outer._m[k], momentum[k]) for k in momentum)
