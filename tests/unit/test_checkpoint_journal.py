"""The round journal beside the checkpoints is the run's history, nothing more: a manifest stays
the same size however long the run, the journal is appended one self-checking, hash-chained line
per round, and any damage to it (a digit changed, a byte inserted, a line deleted, the file cut
or deleted) is reported in one line naming where, counted, and quarantined from the damaged line
on, while the newest checkpoint still loads (R34). The aggregator itself resumes its newest
checkpoint over a damaged journal, and refuses another run's checkpoints in one line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from powertrip.rounds.journal import JournalEntry
from powertrip.rounds.loop import RoundOutcome
from powertrip.services.aggregator import checkpoint, journal_file, metrics
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.journal_file import NAME, JournalFile
from powertrip.services.common.config import load_config
from tests.unit.test_checkpoint import fits, params, state

LOGGER = "powertrip.services.aggregator.journal_file"
SITES = 50


def entry(r: int) -> dict:
    """Round ``r`` as a real run journals it: 20 of 50 sites, every probe measured."""
    rng = np.random.default_rng(r)
    f = [float(x) for x in rng.random(8)]
    selected = tuple(sorted(int(s) for s in rng.choice(SITES, 20, replace=False)))
    outcome = RoundOutcome(f[0], f[1], (f[2], f[3], 20.0), 20, f[4], f[5], projection=(f[6], f[7]))
    down = (4, 7) if r == 2 else ()
    return JournalEntry(r, selected, outcome, down, 60.5 * r, 60.5).to_json()


def run_rounds(directory: Path, rounds: int, save_at: set[int]) -> JournalFile:
    """Journal ``rounds`` rounds, checkpointing (the real save path) at the rounds ``save_at``,
    which appends the journal's staged rounds first, as the run does."""
    journal = JournalFile(directory)
    for r in range(1, rounds + 1):
        journal.extend([entry(r)])
        if r in save_at:
            checkpoint.save(directory, r, params(float(r)), state(r), journal)
    return journal


@pytest.mark.reliability("R30")
def test_the_manifest_is_the_same_size_after_10000_rounds_as_after_10(tmp_path):
    saves = set(range(1, 11)) | set(range(100, 10_001, 100))
    run_rounds(tmp_path, 10_000, saves)
    manifest = (tmp_path / "round-010000.json").stat().st_size
    ckpt = checkpoint.load_latest(tmp_path, fits())
    assert ckpt is not None and ckpt.round == 10_000
    small = tmp_path / "small"
    run_rounds(small, 10, set(range(1, 11)))
    assert abs(manifest - (small / "round-000010.json").stat().st_size) <= 16
    # the history is in the journal file instead: one line per round, all of it intact
    history = journal_file.recover(tmp_path, 10_000)
    assert history.damage is None and [e.round for e in history.entries] == [*range(1, 10_001)]
    assert history.entries[1].unavailable == (4, 7) and history.entries[1].time_s == 121.0


def test_lines_a_crash_left_past_the_checkpoint_are_not_damage_and_are_cut_off(tmp_path, caplog):
    run_rounds(tmp_path, 3, {1, 2, 3})
    with (tmp_path / NAME).open("ab") as f:
        f.write(b'{"entry":{"round":4,"sel')  # a crash in the middle of round 4's append
    caplog.set_level(logging.WARNING, logger=LOGGER)
    history = journal_file.recover(tmp_path, 3)
    assert history.damage is None and [r for r in caplog.records if r.name == LOGGER] == []
    history.writer.extend([entry(4)])
    history.writer.sync()
    assert [e.round for e in journal_file.recover(tmp_path, 4).entries] == [1, 2, 3, 4]
    assert len((tmp_path / NAME).read_bytes().splitlines()) == 4


# -- damage: reported in one line, quarantined, and never a checkpoint's concern ----------------
def lines(directory: Path) -> list[bytes]:
    return (directory / NAME).read_bytes().splitlines(keepends=True)


def write(directory: Path, parts: list[bytes]) -> None:
    (directory / NAME).write_bytes(b"".join(parts))


def digit_changed(d: Path) -> None:  # line 5: its accuracy's first digit after "0."
    ls = lines(d)
    i = ls[4].index(b'"accuracy":0.') + len(b'"accuracy":0.')
    ls[4] = ls[4][:i] + (b"1" if ls[4][i : i + 1] != b"1" else b"2") + ls[4][i + 1 :]
    write(d, ls)


def byte_inserted(d: Path) -> None:  # a space inside line 5
    ls = lines(d)
    ls[4] = ls[4][:20] + b" " + ls[4][20:]
    write(d, ls)


def newline_inserted(d: Path) -> None:  # line 5 split in two
    ls = lines(d)
    ls[4] = ls[4][:20] + b"\n" + ls[4][20:]
    write(d, ls)


def line_deleted(d: Path) -> None:  # line 5 gone: line 6 becomes line 5
    ls = lines(d)
    write(d, ls[:4] + ls[5:])


def cut_mid_line(d: Path) -> None:  # the file ends inside line 5
    data = (d / NAME).read_bytes()
    (d / NAME).write_bytes(data[: sum(map(len, lines(d)[:4])) + 30])


def cut_at_a_line(d: Path) -> None:  # rounds 5..8 gone, on a line boundary
    write(d, lines(d)[:4])


def deleted(d: Path) -> None:
    (d / NAME).unlink()


def last_line_edited(d: Path) -> None:  # the newest round's line: no later line chains to it
    ls = lines(d)
    ls[7] = ls[7].replace(b'"round":8', b'"round":9')
    write(d, ls)


DAMAGE = [
    # (damage, reason, the phrase naming where, rounds still in the history, quarantined)
    (digit_changed, "edited", "line 5 does not match its own SHA-256", 4, True),
    (byte_inserted, "edited", "line 5", 4, True),
    (newline_inserted, "edited", "line 5 is not JSON", 4, True),
    (line_deleted, "edited", "line 5 does not chain to line 4", 4, True),
    (cut_mid_line, "cut", "ends inside line 5", 4, True),
    (cut_at_a_line, "cut", "ends after round 4", 4, False),
    (deleted, "missing", "is missing", 0, False),
    (last_line_edited, "edited", "line 8 does not match its own SHA-256", 7, True),
]


def damaged(reason: str) -> float:
    return metrics.JOURNAL_DAMAGED.labels(reason)._value.get()


@pytest.mark.reliability("R34")
@pytest.mark.parametrize(
    ("damage", "reason", "where", "kept", "aside"), DAMAGE, ids=[d[0].__name__ for d in DAMAGE]
)
def test_journal_damage_is_reported_once_quarantined_and_the_newest_checkpoint_still_loads(
    tmp_path, caplog, damage, reason, where, kept, aside
):
    run_rounds(tmp_path, 8, {7, 8})
    original = (tmp_path / NAME).read_bytes()
    damage(tmp_path)
    after_damage = (tmp_path / NAME).read_bytes() if (tmp_path / NAME).exists() else None
    before = damaged(reason)
    caplog.set_level(logging.WARNING)
    ckpt = checkpoint.load_latest(tmp_path, fits())
    assert ckpt is not None and ckpt.round == 8  # no checkpoint pays for the journal
    history = journal_file.recover(tmp_path, ckpt.round)
    (line,) = [r.getMessage() for r in caplog.records]  # one line, from the journal only
    assert r"\n" not in line and NAME in line and where in line, line
    assert "no checkpoint is affected" in line and "round 8" in line
    assert history.damage == line and damaged(reason) == before + 1
    assert [e.round for e in history.entries] == list(range(1, kept + 1))
    quarantined = sorted(p.name for p in tmp_path.glob(f"{NAME}.damaged-*"))
    assert quarantined == ([f"{NAME}.damaged-1"] if aside else [])
    if aside:  # the damaged file kept whole; the intact prefix is the journal again
        assert (tmp_path / f"{NAME}.damaged-1").read_bytes() == after_damage
    assert original.startswith((tmp_path / NAME).read_bytes() if kept else b"")
    # the history goes on after the intact prefix, and reads back clean
    history.writer.extend([entry(9)])
    history.writer.sync()
    again = journal_file.recover(tmp_path, 9)
    assert again.damage is None
    assert [e.round for e in again.entries] == [*range(1, kept + 1), 9]


# -- the aggregator: its newest checkpoint over a damaged journal; another run's refused --------
def aggregator_config(directory: Path, seed: int = 0, **more: str) -> AggregatorConfig:
    env = more | {
        "POWERTRIP_PROFILER_ADDR": "127.0.0.1:1",  # never reached while the run is built
        "POWERTRIP_INSECURE": "1",
        "POWERTRIP_NUM_SITES": "3",
        "POWERTRIP_NUM_SAMPLES": "400",
        "POWERTRIP_SEED": str(seed),
        "POWERTRIP_CHECKPOINT_DIR": str(directory),
    }
    return load_config(AggregatorConfig, env)


def checkpoint_rounds(run, rounds: int) -> None:
    """Checkpoints of ``rounds`` rounds as the run writes them (its components' states)."""
    journal = JournalFile(run._checkpoints)
    for r in range(1, rounds + 1):
        run.loop.round, run.loop.accuracy = r, 0.2 + 0.1 * r
        run.clock.advance(60.0)
        rec = JournalEntry(r, (0, 1, 2), None, (), run.clock.now(), 60.0)
        journal.extend([rec.to_json()])
        st = {"run": run.run_id, "clock_s": run.clock.now(), "accuracy": run.loop.accuracy}
        st |= {"policy": "powertrip", "components": run.checkpoint_components()}
        checkpoint.save(run._checkpoints, r, run.executor.params, st, journal)


@pytest.mark.reliability("R34")
def test_the_aggregator_resumes_its_newest_checkpoint_over_a_damaged_journal(tmp_path, caplog):
    from powertrip.services.aggregator.run import AggregatorRun

    first = AggregatorRun(aggregator_config(tmp_path))
    first.executor.close()
    checkpoint_rounds(first, 3)
    digit_changed_in_line_2(tmp_path)
    caplog.set_level(logging.WARNING)
    run = AggregatorRun(aggregator_config(tmp_path))
    run.executor.close()
    assert run.loop.round == 3 and run.status.round == 3 and run.clock.now() == 180.0
    assert run.loop.state_dict() == first.loop.state_dict()
    assert run.policy.state_dict() == first.policy.state_dict()
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.startswith("round journal damaged") and "line 2" in line
    assert [r.record.round for r in run.status.rounds] == [1]  # history up to the damage


def digit_changed_in_line_2(d: Path) -> None:
    ls = lines(d)
    ls[1] = ls[1].replace(b'"time_s":120.0', b'"time_s":121.0')
    write(d, ls)


def test_the_aggregator_refuses_another_runs_checkpoints_in_one_line(tmp_path):
    from powertrip.services.aggregator.run import AggregatorRun

    first = AggregatorRun(aggregator_config(tmp_path, seed=0))
    first.executor.close()
    checkpoint_rounds(first, 2)
    with pytest.raises(checkpoint.NoUsableCheckpoint) as refused:
        AggregatorRun(aggregator_config(tmp_path, seed=1))
    assert "belong to another run" in str(refused.value) and "\n" not in str(refused.value)
    assert json.loads((tmp_path / "round-000002.json").read_text())["state"]["run"] == first.run_id


def test_an_ewma_forecasts_power_history_is_resumed_from_the_checkpoint(tmp_path):
    """The ewma forecast is fitted on every report since the start: a resumed run gets them
    from the checkpoint (a replay used to re-ask the profiler), so it forecasts as before."""
    from powertrip.services.aggregator.run import AggregatorRun

    first = AggregatorRun(aggregator_config(tmp_path, POWERTRIP_FORECAST="ewma"))
    first.executor.close()
    for t in (0.0, 60.0, 120.0):
        first.power_history.record(t, np.array([0.2, 0.5, 0.9]) + t / 1000)
    checkpoint_rounds(first, 2)
    run = AggregatorRun(aggregator_config(tmp_path, POWERTRIP_FORECAST="ewma"))
    run.executor.close()
    assert run.forecast is not None and first.forecast is not None
    np.testing.assert_array_equal(
        run.forecast.mean_power(150.0, 300.0), first.forecast.mean_power(150.0, 300.0)
    )
    np.testing.assert_array_equal(run.power_history.power_at(61.0), [0.26, 0.56, 0.96])
