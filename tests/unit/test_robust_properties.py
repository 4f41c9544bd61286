"""Property-based adversaries against the default aggregation (reliability R33).

Instead of enumerating attacks, Hypothesis draws whole rounds: honest updates, then hostile ones
whose values, int8 codec payloads (codes and block scales), weights and arrival slicing are
anything a peer can send. Whatever it draws, the round must hold the rule's invariants:

- nothing but a refusal (``UpdateRejected``) escapes the fold: the run survives;
- the committed model is finite;
- the global model moves by at most the clip norm (each kept update is clipped to it and the
  weights average them), so no site, however many, drags it further;
- a round whose updates are all shorter than the clip is plain FedAvg, bit for bit: an honest
  run's result is unchanged;
- streamed pieces (the aggregator service) give the same decisions as whole rows (the emulator).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from powertrip.aggregation.fedavg import StreamingFedAvg, UpdateRejected
from powertrip.aggregation.robust_fedavg import CLIP as CLIP_ESTIMATE
from powertrip.aggregation.robust_fedavg import AdaptiveBound, RobustFedAvg
from powertrip.codecs import get_codec
from powertrip.rounds.outcome import round_outcome
from powertrip.services.common.tensor_stream import TensorSpec
from powertrip.services.common.update_codec import PART, StreamError, decode_update

pytestmark = pytest.mark.reliability("R33")

SHAPES = {"w": (6, 5), "b": (5,)}
rng = np.random.default_rng(0)
MODEL = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
any32 = st.floats(width=32)  # NaN and infinities too
weights = st.one_of(
    st.floats(1.0, 1e4),
    st.sampled_from([0.0, -1.0, 5e-324, 1e300, float("nan"), float("inf")]),
)


def values(elements: st.SearchStrategy[float]) -> st.SearchStrategy[dict[str, np.ndarray]]:
    return st.fixed_dictionaries(
        {k: hnp.arrays(np.float32, s, elements=elements) for k, s in SHAPES.items()}
    )


def honest(n: int, seed: int, size: float = 0.05) -> list[dict[str, np.ndarray]]:
    g = np.random.default_rng(seed)
    return [
        {k: (size * g.standard_normal(s)).astype(np.float32) for k, s in SHAPES.items()}
        for _ in range(n)
    ]


def change(new: dict[str, np.ndarray]) -> float:
    return math.sqrt(sum(float(np.sum((new[k].astype(np.float64) - MODEL[k]) ** 2)) for k in MODEL))


def fold_round(updates: list[tuple[dict, float]], bound: AdaptiveBound) -> RobustFedAvg:
    agg = RobustFedAvg(MODEL, bound)
    for delta, weight in updates:
        # refused (non-finite values, unusable weight): the round goes on without it
        with contextlib.suppress(UpdateRejected):
            agg.add(delta, weight)
    return agg


@PROPERTY
@given(
    hostile=st.lists(st.tuples(values(st.one_of(finite32, any32)), weights), max_size=4),
    seed=st.integers(0, 2**16),
    clip=st.floats(0.01, 2.0),
)
def test_no_drawn_update_can_end_the_round_or_move_the_model_past_the_clip(hostile, seed, clip):
    bound = AdaptiveBound.from_state_dict({"clip": clip, "zeroing": 10.0})
    good = [(d, 100.0) for d in honest(3, seed)]
    agg = fold_round(good + hostile, bound)
    assert agg.count >= len(good)  # honest updates are never dropped by hostile ones
    new = agg.apply(MODEL)
    assert all(np.isfinite(v).all() for v in new.values())
    assert change(new) <= agg.clip_norm * (1 + 1e-5)
    # the next round's bound moved by at most one geometric step per estimate
    after = agg.bound_after()
    clip = CLIP_ESTIMATE
    lowest, highest = math.exp(-clip.lr * (1 - clip.gamma)), math.exp(clip.lr * clip.gamma)
    assert lowest - 1e-12 <= after.clip_norm / bound.clip_norm <= highest + 1e-12


@PROPERTY
@given(
    codes=hnp.arrays(np.int8, (35,), elements=st.integers(-127, 127)),
    scales=hnp.arrays(np.float32, (1,), elements=any32),
    weight=weights,
    seed=st.integers(0, 2**16),
)
def test_an_int8_payload_with_any_scales_is_refused_or_bounded(codes, scales, weight, seed):
    """The service decodes a coded update before the fold: a scale of 1e20, NaN or Inf either
    fails decoding (a refused stream) or gives values the fold bounds like any other."""
    codec = get_codec("int8")
    model = [TensorSpec("all", (35,), "float32")]
    flat = {"all": np.concatenate([MODEL["w"].reshape(-1), MODEL["b"]])}
    parts = {f"all{PART}codes": codes, f"all{PART}scales": scales}
    try:
        decoded = decode_update(model, codec, parts)
    except StreamError:
        return
    agg = RobustFedAvg(flat)
    good = {"all": (0.05 * np.random.default_rng(seed).standard_normal(35)).astype(np.float32)}
    agg.add(good, 100.0)
    with contextlib.suppress(UpdateRejected):
        agg.add(decoded, weight)
    new = agg.apply(flat)
    moved = math.sqrt(float(np.sum((new["all"].astype(np.float64) - flat["all"]) ** 2)))
    assert np.isfinite(new["all"]).all() and moved <= agg.clip_norm * (1 + 1e-5)


@PROPERTY
@given(seed=st.integers(0, 2**16), n=st.integers(1, 6), w=st.lists(st.floats(1, 1e4), min_size=6))
def test_a_round_of_updates_inside_the_clip_is_plain_fedavg_bit_for_bit(seed, n, w):
    updates = honest(n, seed, size=0.01)  # relative norm ~0.02: inside the first round's clip
    robust, plain = RobustFedAvg(MODEL), StreamingFedAvg(MODEL)
    for d, weight in zip(updates, w, strict=False):
        robust.add(d, weight)
        plain.add(d, weight)
    assert robust.clipped == robust.dropped == 0
    a, b = robust.apply(MODEL), plain.apply(MODEL)
    assert all(np.array_equal(a[k], b[k]) for k in MODEL)


@PROPERTY
@given(
    hostile=st.lists(values(finite32), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
    piece=st.integers(1, 29),
)
def test_streamed_pieces_and_whole_rows_get_the_same_decisions(hostile, seed, piece):
    """The aggregator service folds an update from pieces of any size, the emulator as rows:
    norms summed in float64 and rounded to float32 make the same drop and clip decisions."""
    updates = honest(3, seed) + hostile
    weights_ = [float(10 + j) for j in range(len(updates))]
    rows = RobustFedAvg(MODEL)
    rows.add_rows({k: np.stack([u[k] for u in updates]) for k in SHAPES}, weights_)
    streamed = RobustFedAvg(MODEL)
    for u, weight in zip(updates, weights_, strict=True):
        pieces = [
            (k, i, u[k].reshape(-1)[i : i + piece])
            for k in SHAPES
            for i in range(0, u[k].size, piece)
        ]
        streamed.add_pieces(pieces, weight)
    assert (rows.dropped, rows.clipped, rows.count) == (
        streamed.dropped,
        streamed.clipped,
        streamed.count,
    )
    assert rows.norms == streamed.norms
    if rows.count:
        a, b = rows.apply(MODEL), streamed.apply(MODEL)
        for k in MODEL:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_one_round_of_outcome_carries_the_next_bound_and_the_decisions():
    """``round_outcome`` hands the next round's bound and the counts to the run (the emulator
    and the service both keep the bound from it; the service checkpoints it)."""
    agg = RobustFedAvg(MODEL)
    for d in honest(3, 1):
        agg.add(d, 1.0)
    agg.add({k: np.full(s, 1e30, np.float32) for k, s in SHAPES.items()}, 1.0)
    out = round_outcome(agg, MODEL, lambda p: (0.5, 1.0), selected=4)
    assert (out.dropped, out.contributions) == (1, 3)
    assert out.aggregation_state == AdaptiveBound().after(agg.norms)
    assert AdaptiveBound.from_state_dict(out.aggregation_state.state_dict()) == (
        out.aggregation_state
    )


def test_a_persistent_attack_cannot_push_the_bound_out_of_float_range():
    """Ten thousand rounds whose norms are all above both estimates (the most any round can
    push) leave finite estimates a checkpoint can hold."""
    bound = AdaptiveBound()
    for _ in range(10_000):
        bound = bound.after([math.inf, 1e300])
    assert math.isfinite(bound.zeroing_norm) and math.isfinite(bound.clip_norm)
    assert AdaptiveBound.from_state_dict(bound.state_dict()) == bound


def test_running_statistics_are_averaged_unclipped_and_judged_apart():
    """BatchNorm's running means and variances are estimates, not steps: a clipped update
    shortens its trained tensors only, its statistics are averaged as sent; an update whose
    statistics are extreme against the model's is dropped whole."""
    template = {"w": np.ones(4, np.float32), "bn.running_var": np.ones(2, np.float32)}
    agg = RobustFedAvg(template, statistics=frozenset({"bn.running_var"}))
    long = {"w": np.full(4, 10.0, np.float32), "bn.running_var": np.full(2, 0.5, np.float32)}
    agg.add(long, 1.0)  # |w part| = 20 against a clip of 0.25 * |w| = 0.5: clipped
    assert agg.clipped == 1
    mean = agg.mean_delta()
    assert float(np.linalg.norm(mean["w"])) == pytest.approx(agg.clip_norm, rel=1e-6)
    assert np.array_equal(mean["bn.running_var"], long["bn.running_var"])  # as sent
    poisoned = {"w": np.zeros(4, np.float32), "bn.running_var": np.full(2, 1e6, np.float32)}
    agg.add(poisoned, 1.0)
    assert agg.dropped == 1
