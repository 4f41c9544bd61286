"""The one builder of a round's outcome, shared by the emulator and the aggregator service: it
commits the FedAvg step (Eq. 2) and reports what the selection policies learn from the round."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.aggregation.fedavg import StreamingFedAvg, delta_sketch, sketch_stride
from powertrip.rounds.outcome import round_outcome

MODEL = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "b": np.ones(3, np.float32)}
SITES = [
    ({k: np.full_like(v, 0.1 * (i + 1)) + 0.01 * i * v for k, v in MODEL.items()}, float(i + 2))
    for i in range(4)
]


def folded(sites=SITES, direction=None):
    agg, half = StreamingFedAvg(MODEL, direction=direction), StreamingFedAvg(MODEL)
    for j, (delta, weight) in enumerate(sites):
        agg.add(delta, weight)
        if j % 2 == 0:
            half.add(delta, weight)
    return agg, half


def mean_of(params):
    """A stand-in evaluation: (accuracy, loss) from the model's values."""
    total = sum(float(v.sum()) for v in params.values())
    return total / 100.0, -total


def test_the_new_model_is_the_weighted_mean_delta_added_to_the_global_model():
    agg, _ = folded()
    reference, _ = folded()
    outcome = round_outcome(agg, MODEL, mean_of, selected=4)
    want = reference.apply(MODEL)
    assert all(np.array_equal(outcome.params[k], want[k]) for k in MODEL)  # bit for bit
    assert (outcome.accuracy, outcome.loss) == mean_of(want)


def test_the_global_model_is_left_untouched():
    before = {k: v.copy() for k, v in MODEL.items()}
    round_outcome(folded()[0], MODEL, mean_of, selected=4)
    assert all(np.array_equal(MODEL[k], before[k]) for k in MODEL)


def test_the_outcome_reports_dispersion_contributions_and_the_half_probe():
    agg, half = folded()
    ref_agg, ref_half = folded()
    outcome = round_outcome(agg, MODEL, mean_of, selected=4, half=half)
    assert outcome.dispersion == ref_agg.dispersion()
    assert outcome.contributions == 4
    assert outcome.half_sites == ref_half.dispersion()[2]
    assert (outcome.half_accuracy, outcome.half_loss) == mean_of(ref_half.apply(MODEL))


@pytest.mark.parametrize("selected", [1, 0])
def test_the_half_probe_needs_two_selected_sites(selected):
    agg, half = folded(SITES[:1])
    outcome = round_outcome(agg, MODEL, mean_of, selected=selected, half=half)
    assert outcome.half_loss is outcome.half_sites is outcome.half_accuracy is None


def test_an_empty_half_gives_no_probe():
    agg, _ = folded()
    outcome = round_outcome(agg, MODEL, mean_of, selected=4, half=StreamingFedAvg(MODEL))
    assert outcome.half_loss is None


def test_the_projection_is_reported_only_with_a_previous_global_delta():
    assert round_outcome(folded()[0], MODEL, mean_of, selected=4).projection is None
    moved = {k: v + 0.5 for k, v in MODEL.items()}
    direction = delta_sketch(moved, MODEL, sketch_stride(MODEL))
    agg, _ = folded(direction=direction)
    ref, _ = folded(direction=direction)
    assert round_outcome(agg, MODEL, mean_of, selected=4).projection == ref.projection()
