"""bfloat16 updates on the wire: uint16 bits rounded as torch rounds, scanned for inf/NaN on their
exponent bits, widened exactly (bits << 16) piece by piece into the float32 fold."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from powertrip.aggregation.fedavg import StreamingFedAvg
from powertrip.aggregation.robust import Aggregation
from powertrip.services.aggregator.collector import RoundCollector
from powertrip.services.common.bf16 import all_finite_bf16, bf16_bits, widen_into
from powertrip.services.common.tensor_receiver import TensorStreamReceiver
from powertrip.services.common.tensor_stream import StreamError, encode, specs_of
from powertrip.services.worker.sites_host import SiteUpdate
from powertrip.services.worker.uploader import update_messages, update_wire
from tests.unit.test_tensor_stream import receive  # the stream's one reference reader

TEMPLATE = {
    "w": np.zeros((5, 7), np.float32),
    "b": np.zeros(7, np.float32),
    "scale": np.zeros((), np.float64),  # not float32: travels as itself
}


def update(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in TEMPLATE.items()}
    out["scale"] = np.array(seed / 4, np.float64)
    return out


def widened(a: np.ndarray) -> np.ndarray:
    """What the aggregator must see of a float32 tensor sent as bfloat16."""
    if a.dtype != np.float32:
        return a
    bits = bf16_bits(a)
    return widen_into(bits, np.empty(bits.shape, np.uint32)).copy()


def test_narrowing_rounds_to_nearest_even_exactly_as_torch_does():
    rng = np.random.default_rng(1)
    a = rng.standard_normal(100_000).astype(np.float32) * np.float32(1e3)
    ties = np.float32(1.0) + np.float32(2.0**-8) * np.arange(1, 8, dtype=np.float32)
    a = np.concatenate([a, ties, np.array([0.0, -0.0, 1e-40, 3.4e38, -np.inf], np.float32)])
    want = torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(bf16_bits(a), want)
    back = torch.from_numpy(a).to(torch.bfloat16).float().numpy()
    assert np.array_equal(widen_into(bf16_bits(a), np.empty(a.size, np.uint32)), back)


@pytest.mark.reliability("R12")
def test_the_finite_scan_reads_the_exponent_bits():
    assert all_finite_bf16(bf16_bits(np.array([1.0, -3e38, 1e-45], np.float32)))
    for bad in (np.inf, -np.inf, np.nan, 3.4e38):  # 3.4e38 rounds up to inf in bfloat16
        assert not all_finite_bf16(bf16_bits(np.array([0.5, bad], np.float32)))


@pytest.mark.parametrize("chunk", [1, 3, 16, 1 << 20])
def test_a_bf16_stream_replays_as_the_float32_widening_of_its_bits(chunk):
    u = update(3)
    rx = receive(encode(u, chunk, bf16=True), specs_of(TEMPLATE))
    assert [s.dtype for s in rx.specs] == ["bfloat16", "bfloat16", "float64"]
    assert rx.total_bytes == (35 + 7) * 2 + 8  # half the float32 bytes
    got = rx.arrays()
    for k in TEMPLATE:
        assert got[k].dtype == TEMPLATE[k].dtype
        assert np.array_equal(got[k], widened(u[k]))
    seen = dict.fromkeys(TEMPLATE, 0)
    for name, start, values in rx.pieces(piece_bytes=6):  # pieces cut within a tensor
        assert values.dtype == TEMPLATE[name].dtype and start == seen[name]
        seen[name] += values.size
    assert seen == {k: v.size for k, v in TEMPLATE.items()}


def test_the_fold_of_bf16_updates_equals_folding_their_float32_widening():
    selected = [4, 1, 7]
    col = RoundCollector(1, selected, TEMPLATE, aggregation=Aggregation("fedavg"))
    ref = StreamingFedAvg(TEMPLATE)
    for s in selected:
        col.admit(s, 1)
        col.commit(s, receive(encode(update(s), 64, bf16=True), specs_of(TEMPLATE)), float(s))
        ref.add({k: widened(v) for k, v in update(s).items()}, float(s))
    col.close()
    got, want = col.agg.apply(TEMPLATE), ref.apply(TEMPLATE)
    assert all(np.array_equal(got[k], want[k]) for k in TEMPLATE)


@pytest.mark.reliability("R12")
@pytest.mark.parametrize("bad", [np.nan, np.inf, 3.4e38])
@pytest.mark.parametrize("chunk", [1, 5, 1 << 20])
def test_a_non_finite_bf16_value_is_refused_whatever_the_chunk_boundaries(bad, chunk):
    u = update(2)
    u["w"][3, 4] = bad
    with pytest.raises(StreamError, match="NaN or Inf") as exc:
        receive(encode(u, chunk, bf16=True), specs_of(TEMPLATE))
    assert exc.value.reason == "non_finite"


def test_bf16_is_accepted_for_a_float32_tensor_only():
    rx = TensorStreamReceiver(specs_of(TEMPLATE))
    header = next(encode(update(1), bf16=True))
    header.tensors[2].dtype = "bfloat16"  # the float64 tensor claims bfloat16
    header.total_bytes -= 6
    with pytest.raises(StreamError, match="expected float64"):
        rx.header(header)
    rx = TensorStreamReceiver(specs_of(TEMPLATE))
    header = next(encode({**update(1), "w": update(1)["w"].astype(np.float16)}))
    with pytest.raises(StreamError, match="expected float32"):  # only bfloat16 narrows
        rx.header(header)


def test_the_bf16_wire_bytes_equal_protobufs_and_whole_updates_are_unchanged():
    update_ = SiteUpdate(site=3, delta=update(3), num_samples=12.0, train_seconds=0.5)
    for bf16 in (False, True):
        want = [m.SerializeToString() for m in update_messages("w-3", 7, update_, 64, bf16)]
        assert list(update_wire("w-3", 7, update_, 64, bf16)) == want
    plain = list(update_wire("w-3", 7, update_, 64))
    assert plain == list(update_wire("w-3", 7, update_, 64, shard=None))
    assert sum(map(len, list(update_wire("w-3", 7, update_, 64, True)))) < sum(map(len, plain))
