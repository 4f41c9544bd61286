"""Update codecs: round-trip error bounds, exact wire bytes, error feedback, the registry."""

from __future__ import annotations

import math

import numpy as np
import pytest

from powertrip.codecs import ErrorFeedback, codec_names, get_codec
from powertrip.codecs.base import header_bytes
from powertrip.codecs.blocks import BLOCK

SHAPES = [(1,), (7,), (255,), (256,), (257,), (33, 17), (4, 3, 50)]
NAMES = ["none", "int8", "int4", "fp8", "topk-10", "topk-1", "topk-0.5"]


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_registry_names_and_unknown_codec_names_the_known_ones():
    assert codec_names() == ["fp8", "int4", "int8", "none", "topk-<p>"]
    assert get_codec("topk-10").name == "topk-10"
    for bad in ("int3", "topk-", "topk-abc", "topk-0", "topk-101"):
        with pytest.raises(ValueError) as err:
            get_codec(bad)
        if bad == "int3":
            assert "known: fp8, int4, int8, none, topk-<p>" in str(err.value)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", SHAPES)
def test_wire_bytes_are_exact_and_ratio_agrees(name, shape):
    codec = get_codec(name)
    x = _x(shape)
    payload = codec.encode(x)
    packed = sum(a.nbytes for a in payload.parts.values())
    assert codec.wire_bytes(payload) == packed + header_bytes(shape)
    assert codec.wire_bytes(payload) == codec.bytes_for(x.size) + header_bytes(shape)
    n = x.size
    expected = {
        "none": 4 * n,
        "int8": n + 4 * math.ceil(n / BLOCK),
        "fp8": n + 4 * math.ceil(n / BLOCK),
        "int4": math.ceil(n / 2) + 4 * math.ceil(n / BLOCK),
    }.get(name)
    if name.startswith("topk-"):
        expected = 8 * max(1, math.ceil(n * float(name[5:]) / 100))
    assert codec.bytes_for(n) == expected
    if name != "none":
        ratio = codec.ratio([shape])
        assert ratio == pytest.approx(codec.wire_bytes(payload) / (4 * n))
    assert codec.decode(payload).shape == shape


def test_large_tensor_ratios():
    assert get_codec("none").ratio() == 1.0
    assert get_codec("int8").ratio() == pytest.approx(0.25 + 1 / BLOCK)
    assert get_codec("int4").ratio() == pytest.approx(0.125 + 1 / BLOCK)
    assert get_codec("topk-10").ratio() == pytest.approx(0.2)
    assert get_codec("topk-1").ratio() == pytest.approx(0.02)


def test_none_is_lossless():
    x = _x((33, 17))
    c = get_codec("none")
    assert np.array_equal(c.decode(c.encode(x)), x)


@pytest.mark.parametrize("name, qmax", [("int8", 127), ("int4", 7)])
@pytest.mark.parametrize("shape", SHAPES)
def test_integer_codecs_err_at_most_half_a_scale_per_element(name, qmax, shape):
    codec = get_codec(name)
    x = _x(shape, 1) * 3
    payload = codec.encode(x)
    err = np.abs(codec.decode(payload) - x).ravel()
    flat = x.ravel()
    for b, scale in enumerate(payload.parts["scales"]):
        block = slice(b * BLOCK, (b + 1) * BLOCK)
        assert scale == pytest.approx(np.abs(flat[block]).max() / qmax)
        assert np.all(err[block] <= scale / 2 * (1 + 1e-5))


def test_fp8_relative_error_is_e4m3s():
    codec = get_codec("fp8")
    x = _x((4096,), 2)
    y = codec.decode(codec.encode(x))
    big = np.abs(x) > np.abs(x).max() / 448 * 2**-6 * 64  # well above the subnormals
    assert np.all(np.abs(y - x)[big] <= np.abs(x)[big] * 2**-4 * (1 + 1e-6))


@pytest.mark.parametrize("p", [0.5, 1, 10, 50, 100])
def test_topk_keeps_exactly_the_k_largest(p):
    codec = get_codec(f"topk-{p:g}")
    x = _x((40, 25), 3)
    y = codec.decode(codec.encode(x))
    k = max(1, math.ceil(x.size * p / 100))
    kept = y != 0
    assert kept.sum() == k
    assert np.array_equal(y[kept], x[kept])
    assert np.abs(x[~kept]).max(initial=0) <= np.abs(x[kept]).min()


def test_all_zero_tensor_survives_every_codec():
    for name in NAMES:
        codec = get_codec(name)
        z = np.zeros((300,), np.float32)
        assert np.array_equal(codec.decode(codec.encode(z)), z)


@pytest.mark.parametrize("name", ["int8", "int4", "fp8", "topk-10", "topk-1"])
def test_error_feedback_tracks_the_sum_of_true_deltas(name):
    """With EF, sum of decoded = sum of true - final residual; the residual stays bounded, so
    the average sent update converges to the average true one. Without EF a biased codec
    (top-k drops the same small entries every round) loses mass for good."""
    rng = np.random.default_rng(4)
    T, shape = 200, (30, 20)
    mean = rng.standard_normal(shape).astype(np.float32)
    ef, plain = ErrorFeedback(get_codec(name)), ErrorFeedback(get_codec(name), enabled=False)
    true = sent = sent_plain = np.zeros(shape, np.float64)
    norms = []
    for _ in range(T):
        d = mean + 0.5 * rng.standard_normal(shape).astype(np.float32)
        true = true + d
        sent = sent + ef.apply(7, {"w": d})["w"]
        sent_plain = sent_plain + plain.apply(7, {"w": d})["w"]
        norms.append(ef.residual_norm())
    residual = ef.residuals[7]["w"]
    assert np.allclose(true - sent, residual, atol=1e-3 * T)
    # bounded: no growth over the second half of the rounds
    assert max(norms[T // 2 :]) <= 2 * max(norms[: T // 2]) + 1e-6
    gap_ef = np.linalg.norm(true - sent) / np.linalg.norm(true)
    assert gap_ef < (0.3 if name == "topk-1" else 0.05)
    if name.startswith("topk"):
        gap_plain = np.linalg.norm(true - sent_plain) / np.linalg.norm(true)
        assert gap_plain > 0.5 and gap_plain > 3 * gap_ef
    assert plain.residuals[7] == {}
    assert ef.wire_bytes < ef.raw_bytes
