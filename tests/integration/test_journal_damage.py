"""R34 over real processes: the aggregator SIGKILLed in a round, its round journal then damaged
(one digit changed mid-file, the file cut inside a line, the file deleted, one byte inserted),
and restarted: it resumes its newest checkpoint, whose states stand on their own, and ends with
the final model of an undamaged resume, bit for bit (the golden run's SHA-256; the crash tests
show an undamaged resume equals it). The damage costs one log line and part of the history,
never a checkpoint.

One cluster (``test_crash_recovery``'s machinery: profiler, 2 workers hosting 4 sites, mTLS)
serves every case: the golden run, then one crashed run killed in round ``KILL_ROUND`` whose
checkpoint directory is copied once per damage, each copy damaged and resumed to the end.
Before this change, each damage made both kept checkpoints "rejected" (their journal prefix did
not verify) and the aggregator exited 3.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from powertrip.v1 import aggregator_pb2
from tests.integration.test_crash_recovery import (
    ROUNDS,
    crash_plan,
    golden_run,
    model_sha256,
    rounds,
    start_aggregator,
)

pytestmark = pytest.mark.slow
KILL_ROUND = 4  # checkpoints of rounds 2 and 3 kept, three journal lines


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """The golden run's bench, and a checkpoint directory left by an aggregator SIGKILLed in
    the middle of round ``KILL_ROUND``'s fold."""
    out = tmp_path_factory.mktemp("journal-damage")
    for b in golden_run(out, crash_plan(out)):
        ckpts = out / "killed"
        start_aggregator(b, ckpts, f"aggregation@{KILL_ROUND}")
        assert len((ckpts / "journal.jsonl").read_bytes().splitlines()) == KILL_ROUND - 1
        yield b, ckpts


def digit_changed_mid_file(journal: Path) -> None:
    lines = journal.read_bytes().splitlines(keepends=True)
    m = len(lines) // 2
    i = lines[m].index(b'"accuracy":0.') + len(b'"accuracy":0.')
    digit = b"1" if lines[m][i] != ord("1") else b"2"
    lines[m] = lines[m][:i] + digit + lines[m][i + 1 :]
    journal.write_bytes(b"".join(lines))


def cut(journal: Path) -> None:
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) // 2])


def deleted(journal: Path) -> None:
    journal.unlink()


def byte_inserted(journal: Path) -> None:
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) // 2] + b"7" + data[len(data) // 2 :])


@pytest.mark.reliability("R34")
@pytest.mark.parametrize("damage", [digit_changed_mid_file, cut, deleted, byte_inserted])
def test_a_damaged_journal_resumes_the_newest_checkpoint_and_ends_bit_identical(crashed, damage):
    bench, killed = crashed
    ckpts = bench.out / f"damaged-{damage.__name__}"
    shutil.copytree(killed, ckpts)
    damage(ckpts / "journal.jsonl")

    resumed = start_aggregator(bench, ckpts, None)
    assert f"resuming after round {KILL_ROUND - 1}" in resumed.log
    assert "checkpoint rejected" not in resumed.log and "refusing to start" not in resumed.log
    (report,) = [line for line in resumed.log.splitlines() if "round journal damaged" in line]
    assert "journal.jsonl" in report and "no checkpoint is affected" in report
    final = bench.final
    assert final is not None and final.state == aggregator_pb2.RUN_STATE_DONE, final
    assert final.round == ROUNDS
    assert model_sha256(ckpts) == bench.golden_sha  # the model of an undamaged resume
    # the rounds run after the resume are the golden run's; the history kept before them too
    golden = {r[0]: r for r in rounds(bench.golden_status)}
    got = rounds(final)
    assert [r[0] for r in got][-(ROUNDS - KILL_ROUND + 1) :] == list(range(KILL_ROUND, ROUNDS + 1))
    assert all(r == golden[r[0]] for r in got)
