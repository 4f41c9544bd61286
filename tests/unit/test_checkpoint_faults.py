"""Checkpoints under attack and under failing disks: a pickle planted as the model is never
executed (the previous round loads instead); a disk whose fsync fails leaves the previous round
intact and no temporary file, and costs one warning and one count, not the run; what a crash
inside ``save`` leaves half-done is cleaned up; the crash hook refuses an unknown point."""

from __future__ import annotations

import builtins
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from powertrip.services.aggregator import checkpoint, journal_file, metrics
from powertrip.services.aggregator.durable_files import canonical_sha256, sha256_file
from powertrip.services.aggregator.journal_file import JournalFile
from powertrip.services.common.config import ConfigError
from powertrip.services.common.fault_points import armed_faults, parse
from tests.unit.test_checkpoint import fits, state

LOGGER = "powertrip.services.aggregator.checkpoint"
REPO = Path(__file__).resolve().parents[2]


def params(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full(3, value, np.float32), "b": np.full(1, value, np.float32)}


def step(journal: JournalFile, r: int) -> JournalFile:
    """``journal`` with round ``r`` staged, as the run hands each round to it."""
    journal.extend([{"round": r, "selected": [0, 1], "outcome": None}])
    return journal


def save_or_report(directory: Path, r: int, journal: JournalFile) -> bool:
    """Round ``r``'s checkpoint (its model all ``r``), as the run's writer saves it."""
    return checkpoint.save_or_report(
        r, lambda: checkpoint.save(directory, r, params(float(r)), state(r), step(journal, r))
    )


def two_rounds(directory: Path) -> JournalFile:
    """Rounds 1 and 2 committed; the run's journal writer."""
    journal = JournalFile(directory)
    for r in (1, 2):
        checkpoint.save(directory, r, params(float(r)), state(r), step(journal, r))
    return journal


def files(rounds: tuple[int, ...]) -> list[str]:
    """The checkpoints of ``rounds`` and the journal file beside them."""
    return ["journal.jsonl"] + [f"round-00000{r}.{e}" for r in rounds for e in ("json", "npz")]


class Planted:
    """Unpickling this creates ``marker``: proof that a load executed code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


def plant(directory: Path, model_bytes: bytes) -> None:
    """Replace round 2's model and make every checksum agree with it, as an attacker with write
    access to the directory could: only the loader itself stands in the way."""
    npz = directory / "round-000002.npz"
    npz.write_bytes(model_bytes)
    manifest = directory / "round-000002.json"
    data = json.loads(manifest.read_text())
    data["model_sha256"] = sha256_file(npz)
    body = {k: v for k, v in data.items() if k != "sha256"}
    data["sha256"] = canonical_sha256(body)
    manifest.write_text(json.dumps(data))


def raw_pickle(marker: Path) -> bytes:
    import pickle

    return pickle.dumps({"w": Planted(marker)})


def npz_with_object_array(marker: Path) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, w=np.array([Planted(marker)], dtype=object), b=np.zeros(1, np.float32))
    return buf.getvalue()


@pytest.mark.reliability("R7")
@pytest.mark.parametrize("make", [raw_pickle, npz_with_object_array])
def test_a_planted_pickle_is_never_executed_and_the_previous_round_loads(tmp_path, make):
    ckpts, marker = tmp_path / "ckpts", tmp_path / "PWNED"
    two_rounds(ckpts)
    plant(ckpts, make(marker))
    before = metrics.CHECKPOINT_REJECTED.labels("model-format")._value.get()
    ckpt = checkpoint.load_latest(ckpts, fits())
    assert not marker.exists()
    assert ckpt is not None and ckpt.round == 1
    np.testing.assert_array_equal(ckpt.params["w"], params(1.0)["w"])
    assert metrics.CHECKPOINT_REJECTED.labels("model-format")._value.get() == before + 1
    assert (ckpts / "round-000002.npz.rejected").exists()


def failing_fsync(monkeypatch, fail_call: int) -> None:
    """``os.fsync`` raises EIO on its ``fail_call``-th call (with a journal to append, 1: the
    journal, 2: the model file, 3: the manifest, 4: the directory) and works otherwise."""
    real, calls = os.fsync, []

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == fail_call:
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.reliability("R7")
@pytest.mark.parametrize("fail_call", [2, 3, 4], ids=["model", "manifest", "directory"])
def test_an_fsync_error_keeps_the_previous_round_and_costs_one_warning_not_the_run(
    tmp_path, monkeypatch, caplog, fail_call
):
    journal = two_rounds(tmp_path)
    before = metrics.CHECKPOINT_WRITE_FAILURES._value.get()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    failing_fsync(monkeypatch, fail_call)
    assert save_or_report(tmp_path, 3, journal) is False
    monkeypatch.undo()
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and "round 3 not written" in lines[0] and "\n" not in lines[0]
    assert metrics.CHECKPOINT_WRITE_FAILURES._value.get() == before + 1
    assert not list(tmp_path.glob("*.tmp"))
    previous = checkpoint.load_round(tmp_path, 2, fits())
    assert previous is not None
    np.testing.assert_array_equal(previous.params["w"], params(2.0)["w"])
    # the run goes on: the next round's checkpoint is written and is the newest, its journal
    # whole (round 3's line appended with it when the journal's own fsync failed)
    assert save_or_report(tmp_path, 4, journal) is True
    latest = checkpoint.load_latest(tmp_path, fits())
    assert latest.round == 4
    assert [e.round for e in journal_file.recover(tmp_path, 4).entries] == [1, 2, 3, 4]
    # round 3 counts as written only when its manifest was committed before the failure (the
    # directory's fsync); otherwise round 2 was the fallback until round 4, and round 3's
    # orphaned model (if any) went with the prune
    kept = (3, 4) if fail_call == 4 else (2, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == files(kept)


@pytest.mark.reliability("R7", "R34")
def test_a_journal_append_the_disk_refuses_costs_a_warning_not_the_checkpoint(
    tmp_path, monkeypatch, caplog
):
    journal = two_rounds(tmp_path)
    before = metrics.JOURNAL_WRITE_FAILURES._value.get()
    caplog.set_level(logging.WARNING)
    failing_fsync(monkeypatch, 1)  # the journal's fsync
    assert save_or_report(tmp_path, 3, journal)
    monkeypatch.undo()
    (line,) = [r.getMessage() for r in caplog.records]
    assert "round journal not appended" in line and "\n" not in line
    assert metrics.JOURNAL_WRITE_FAILURES._value.get() == before + 1
    assert checkpoint.load_latest(tmp_path, fits()).round == 3
    # the round stays staged: the next append writes it before round 4's
    assert save_or_report(tmp_path, 4, journal)
    assert [e.round for e in journal_file.recover(tmp_path, 4).entries] == [1, 2, 3, 4]


@pytest.mark.reliability("R7")
def test_a_crash_between_model_and_manifest_leaves_the_previous_round_and_no_lasting_garbage(
    tmp_path,
):
    """What ``checkpoint-write`` leaves (the model of round 3 in place, its manifest only as a
    temporary file): the loader takes round 2, the start deletes the temporary file, and the
    next save does not trip over the orphaned model."""
    checkpoint.save(tmp_path, 3, params(3.0), state(3), step(two_rounds(tmp_path), 3))
    (tmp_path / "round-000003.json").rename(tmp_path / "round-000003.json.tmp")
    (tmp_path / "round-000002.npz.tmp").write_bytes(b"half a model")
    ckpt = checkpoint.load_latest(tmp_path, fits())
    assert ckpt is not None and ckpt.round == 2
    assert not list(tmp_path.glob("*.tmp"))
    # the restarted run's writer continues from round 2's prefix: round 3's line from before
    # the crash is cut off, not doubled
    resumed = journal_file.recover(tmp_path, ckpt.round).writer
    checkpoint.save(tmp_path, 3, params(3.5), state(3), step(resumed, 3))
    again = checkpoint.load_latest(tmp_path, fits())
    assert again.round == 3 and again.params["w"][0] == np.float32(3.5)
    assert [e.round for e in journal_file.recover(tmp_path, 3).entries] == [1, 2, 3]
    assert len((tmp_path / "journal.jsonl").read_text().splitlines()) == 3


def test_a_model_left_without_its_manifest_is_pruned_by_a_later_save(tmp_path):
    journal = two_rounds(tmp_path)
    (tmp_path / "round-000000.npz").write_bytes(b"orphan of a crash during a prune")
    checkpoint.save(tmp_path, 3, params(3.0), state(3), step(journal, 3))
    assert sorted(p.name for p in tmp_path.iterdir()) == files((2, 3))


def test_the_crash_hook_parses_points_and_rounds_and_refuses_unknown_ones():
    assert parse("") == {}
    assert parse("aggregation@2, checkpoint-write@3") == {"aggregation": 2, "checkpoint-write": 3}
    with pytest.raises(ConfigError, match="unknown point 'checkpoint-wrte'"):
        parse("checkpoint-wrte@3")
    with pytest.raises(ConfigError, match="POINT@ROUND"):
        parse("aggregation")
    assert armed_faults({"POWERTRIP_FAULT_INJECT": "checkpoint-commit@1"}) == {
        "checkpoint-commit": 1
    }


def test_an_unknown_crash_point_stops_the_aggregator_at_start_with_exit_code_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("POWERTRIP_")}
    env |= {
        "POWERTRIP_PROFILER_ADDR": "127.0.0.1:1",
        "POWERTRIP_INSECURE": "1",
        "POWERTRIP_NUM_SITES": "2",
        "POWERTRIP_CHECKPOINT_DIR": str(tmp_path),
        "POWERTRIP_FAULT_INJECT": "agregation@3",
    }
    cmd = [sys.executable, "-m", "powertrip.services.aggregator"]
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "POWERTRIP_FAULT_INJECT" in done.stderr and "unknown point" in done.stderr
