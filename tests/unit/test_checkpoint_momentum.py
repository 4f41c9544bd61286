"""The outer step's momentum is checkpointed with the model (R6): in the model's npz under a
reserved prefix, so the model's SHA-256 covers it; a checkpoint loads it back apart from the
model arrays, and a run accepts a checkpoint only with the momentum its outer step keeps."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from powertrip.services.aggregator import checkpoint
from powertrip.services.aggregator.journal_file import JournalFile
from powertrip.services.aggregator.resume import fits_run
from tests.unit.test_checkpoint import RUN, restore, state

LOGGER = "powertrip.services.aggregator.checkpoint"


def params(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full(3, value, np.float32), "b": np.full(1, value, np.float32)}


def save(directory, r: int, momentum=None) -> None:
    journal = JournalFile(directory)
    for k in range(1, r + 1):
        journal.extend([{"round": k, "selected": [0, 1], "outcome": None}])
    checkpoint.save(directory, r, params(float(r)), state(r), journal, momentum)


def model_files(npz) -> list[str]:
    """The npz's entries but the run state's arrays (``checkpoint.STATE``)."""
    return [k for k in np.load(npz).files if not k.startswith(checkpoint.STATE)]


def test_the_momentum_round_trips_bit_for_bit_beside_the_model(tmp_path):
    momentum = {"w": np.array([1e-8, -3.5, 7.25], np.float32), "b": np.array([0.1], np.float32)}
    save(tmp_path, 1, momentum)
    ckpt = checkpoint.load_latest(tmp_path, fits_run(params(0.0), RUN, restore, momentum=True))
    assert ckpt is not None and sorted(ckpt.params) == ["b", "w"]  # no momentum among them
    assert all(np.array_equal(ckpt.momentum[k], momentum[k]) for k in momentum)
    assert all(ckpt.momentum[k].dtype == np.float32 for k in momentum)
    assert sorted(model_files(tmp_path / "round-000001.npz")) == sorted(
        ["w", "b", checkpoint.MOMENTUM + "w", checkpoint.MOMENTUM + "b"]
    )


def test_a_fedavg_checkpoint_has_no_momentum_and_loads_as_before(tmp_path):
    save(tmp_path, 1)
    ckpt = checkpoint.load_latest(tmp_path, fits_run(params(0.0), RUN, restore))
    assert ckpt is not None and ckpt.momentum is None
    assert sorted(model_files(tmp_path / "round-000001.npz")) == ["b", "w"]


def test_a_model_array_named_like_the_momentum_is_refused_at_save(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        checkpoint.save(tmp_path, 1, {checkpoint.MOMENTUM + "w": np.zeros(1)}, {})


@pytest.mark.reliability("R6")
@pytest.mark.parametrize(
    ("keeps", "momentum", "why"),
    [
        (True, None, "no outer momentum"),  # a FedAvg run's checkpoint, resumed with nesterov
        (False, params(0.5), "takes no outer step"),  # and the other way round
        (True, {"w": np.zeros(3, np.float32)}, "outer momentum arrays"),  # not the model's
        (True, {"w": np.zeros(2, np.float32), "b": np.zeros(1, np.float32)}, "'w' is"),
    ],
)
def test_a_checkpoint_whose_momentum_does_not_fit_the_run_falls_back(
    tmp_path, caplog, keeps, momentum, why
):
    save(tmp_path, 1, params(0.25) if keeps else None)
    save(tmp_path, 2, momentum)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    ckpt = checkpoint.load_latest(tmp_path, fits_run(params(0.0), RUN, restore, momentum=keeps))
    assert ckpt is not None and ckpt.round == 1
    assert any("incompatible" in r.getMessage() and why in r.getMessage() for r in caplog.records)


def test_a_flipped_momentum_byte_fails_the_models_checksum(tmp_path):
    save(tmp_path, 1, params(0.25))
    npz = tmp_path / "round-000001.npz"
    data = bytearray(npz.read_bytes())
    at = data.rindex(np.float32(0.25).tobytes())  # the momentum is written after the model
    data[at] ^= 0xFF
    npz.write_bytes(bytes(data))
    assert checkpoint.load_latest(tmp_path, start_fresh=True) is None
