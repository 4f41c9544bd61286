"""The aggregator's checkpoints written in the background (``CheckpointWriter``), with the real
save path and real files: a checkpoint is durable before the next one starts, a save the disk
refuses is reported as a synchronous one was (one warning, one count, the run goes on), a bug
in a save surfaces in the run's thread, and a run reports DONE only once its last checkpoint
is durable.

The waits below only let a wrong implementation show itself: a slow machine can make one
pass, never a right one fail."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from powertrip.rounds.loop import RoundRecord
from powertrip.services.aggregator import checkpoint, journal_file, metrics
from powertrip.services.aggregator.checkpoint_writer import CheckpointWriter
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.journal_file import JournalFile
from powertrip.services.aggregator.run_status import RunState
from powertrip.services.common.config import load_config
from tests.unit.test_checkpoint import fits, params, state

LOGGER = "powertrip.services.aggregator.checkpoint"
GLIMPSE_S = 0.3  # how long a wait that must not end is watched


def submit(writer: CheckpointWriter, r: int) -> None:
    """Round ``r`` staged and its checkpoint submitted, as the run does after each round."""
    writer.stage([{"round": r, "selected": [0, 1], "outcome": None}])
    writer.submit(r, params(float(r)), state(r))


def held_saves(monkeypatch) -> tuple[threading.Event, list[int], dict[int, int | None]]:
    """``checkpoint.save`` held until the returned event is set; the rounds whose save began,
    and for each the newest loadable round on disk at that moment."""
    release, began, durable_then = threading.Event(), [], {}
    real = checkpoint.save

    def save(directory: Path, round_index: int, *args, **kwargs) -> Path:
        began.append(round_index)
        newest = checkpoint.load_latest(directory, fits())
        durable_then[round_index] = None if newest is None else newest.round
        release.wait()
        return real(directory, round_index, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save", save)
    return release, began, durable_then


def test_a_checkpoint_is_durable_before_the_next_one_starts(tmp_path, monkeypatch):
    writer = CheckpointWriter(JournalFile(tmp_path))
    release, began, durable_then = held_saves(monkeypatch)
    submit(writer, 1)  # returns while round 1 is being written: the next round goes on
    nxt = threading.Thread(target=submit, args=(writer, 2))
    nxt.start()
    nxt.join(GLIMPSE_S)
    assert nxt.is_alive() and began == [1]  # round 2's save waits for round 1's
    release.set()
    nxt.join()
    assert writer.wait() is True
    assert began == [1, 2] and durable_then == {1: None, 2: 1}  # round 1 loaded when 2 began
    latest = checkpoint.load_latest(tmp_path, fits())
    assert latest.round == 2
    assert [e.round for e in journal_file.recover(tmp_path, 2).entries] == [1, 2]
    assert metrics.CHECKPOINT_ROUND._value.get() == 2


def test_a_save_the_disk_refuses_is_reported_as_before_and_the_run_goes_on(
    tmp_path, monkeypatch, caplog
):
    writer = CheckpointWriter(JournalFile(tmp_path))
    for r in (1, 2):
        submit(writer, r)
    assert writer.wait() is True
    failures = metrics.CHECKPOINT_WRITE_FAILURES._value.get()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    submit(writer, 3)
    assert writer.wait() is False  # on the writer's thread, reported there
    monkeypatch.setattr(os, "fsync", real_fsync)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and "round 3 not written, the run goes on" in lines[0]
    assert metrics.CHECKPOINT_WRITE_FAILURES._value.get() == failures + 1
    assert metrics.CHECKPOINT_ROUND._value.get() == 2  # the last one written
    assert checkpoint.load_latest(tmp_path, fits()).round == 2
    # the next round's checkpoint is written, its journal whole (round 3's line with it)
    submit(writer, 4)
    assert writer.wait() is True
    latest = checkpoint.load_latest(tmp_path, fits())
    assert latest.round == 4
    assert [e.round for e in journal_file.recover(tmp_path, 4).entries] == [1, 2, 3, 4]
    assert metrics.CHECKPOINT_ROUND._value.get() == 4


def test_a_bug_in_a_save_is_raised_in_the_runs_thread(tmp_path):
    writer = CheckpointWriter(JournalFile(tmp_path))
    writer.submit(1, {checkpoint.MOMENTUM + "w": np.zeros(1)}, {})  # a reserved name
    with pytest.raises(ValueError, match="reserved"):
        writer.wait()
    assert writer.wait() is None  # raised once; nothing in flight any more


def test_the_run_reports_done_only_once_its_last_checkpoint_is_durable(tmp_path, monkeypatch):
    from powertrip.services.aggregator import run as run_module

    env = {
        "POWERTRIP_PROFILER_ADDR": "127.0.0.1:1",  # never reached: the round loop is faked
        "POWERTRIP_INSECURE": "1",
        "POWERTRIP_NUM_SITES": "3",
        "POWERTRIP_NUM_SAMPLES": "400",
        "POWERTRIP_CHECKPOINT_DIR": str(tmp_path),
    }
    run = run_module.AggregatorRun(load_config(AggregatorConfig, env))

    def one_round() -> None:
        run.loop.round = 1
        run._on_round(RoundRecord(1, 60.0, 60.0, 3, 0.5, 1.0, (0, 1, 2), 3))

    monkeypatch.setattr(run.loop, "run", one_round)
    release, began, _ = held_saves(monkeypatch)
    training = threading.Thread(target=run._train)
    try:
        training.start()
        training.join(GLIMPSE_S)
        assert training.is_alive() and run.status.state is RunState.TRAINING
        release.set()
        training.join()
    finally:
        release.set()
        run.executor.close()
    assert began == [1] and run.status.state is RunState.DONE
    assert checkpoint.load_round(tmp_path, 1, run._fits) is not None
