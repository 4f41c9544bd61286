"""Checkpoints: the fallback round's model is readable, so a restart can rebuild the last delta."""

from __future__ import annotations

import numpy as np

from services.aggregator import checkpoint
from services.aggregator.executor import GrpcRoundExecutor


def params(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full(3, value, np.float32), "b": np.full(1, value, np.float32)}


def test_load_round_reads_the_kept_fallback_and_not_a_pruned_round(tmp_path):
    for r in (1, 2, 3):
        checkpoint.save(tmp_path, r, params(float(r)), {"clock": r})
    latest = checkpoint.load_latest(tmp_path)
    before = checkpoint.load_round(tmp_path, 2)
    assert latest is not None and latest.round == 3
    assert before is not None and before.round == 2
    np.testing.assert_array_equal(before.params["w"], params(2.0)["w"])
    assert checkpoint.load_round(tmp_path, 1) is None  # pruned: only two are kept


def test_load_round_skips_a_corrupted_model(tmp_path):
    checkpoint.save(tmp_path, 1, params(1.0), {})
    checkpoint.save(tmp_path, 2, params(2.0), {})
    (tmp_path / "round-000001.npz").write_bytes(b"garbage")
    assert checkpoint.load_round(tmp_path, 1) is None


def test_resume_direction_is_the_latest_model_minus_the_one_before(tmp_path):
    ex = GrpcRoundExecutor(None, params(3.5), lambda p: (0.0, 0.0), 0, 1.0, False, None)
    try:
        ex.resume_direction(params(1.0))
        assert ex._direction is not None
        np.testing.assert_array_equal(ex._direction["w"], np.full(3, 2.5, np.float32))
    finally:
        ex.close()
