"""Checkpoints: the fallback round's model is readable, so a restart can rebuild the last delta;
every file is checksummed, and a bad checkpoint is rejected (one log line, one count) for the
previous good one; none good refuses to start unless told to start fresh."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from powertrip.services.aggregator import checkpoint, checkpoint_verify, metrics
from powertrip.services.aggregator.durable_files import canonical_sha256, sha256_file
from powertrip.services.aggregator.executor import GrpcRoundExecutor
from powertrip.services.aggregator.journal_file import JournalFile
from powertrip.services.aggregator.run import _fits_run, _resume_state


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


# -- verification at load: every file checksummed, a bad one rejected for the one before ------
LOGGER = "powertrip.services.aggregator.checkpoint"


def rejected(reason: str) -> float:
    return metrics.CHECKPOINT_REJECTED.labels(reason)._value.get()


def entry(r: int) -> dict:
    return {"round": r, "selected": [0, 1], "outcome": None}


def two_rounds(directory: Path) -> tuple[Path, Path]:
    """Rounds 1 and 2 with a journal; the paths of round 2's manifest and model."""
    journal = JournalFile(directory)
    for r in (1, 2):
        journal.extend([entry(r)])
        checkpoint.save(directory, r, params(float(r)), {"clock_s": 10.0 * r}, journal)
    return directory / "round-000002.json", directory / "round-000002.npz"


def rechain(directory: Path, edit) -> None:
    """Edit the journal's entries and rewrite the file, its hash chain and the newest
    manifest's reference and self-checksum consistently: a forged or buggy-but-signed journal,
    which only the field checks stand in the way of."""
    lines = (directory / "journal.jsonl").read_text().splitlines()
    entries = [json.loads(line)["entry"] for line in lines]
    edit(entries)
    (directory / "journal.jsonl").unlink()
    journal = JournalFile(directory)
    journal.extend(entries)
    ref = journal.sync()
    rewrite(
        directory / "round-000002.json", lambda d: d["state"].__setitem__("journal", ref.to_json())
    )


def rewrite(manifest: Path, edit) -> None:
    """Edit a manifest's JSON and keep its self-checksum right (a structural, not a bit-rot,
    problem)."""
    data = json.loads(manifest.read_text())
    edit(data)
    body = {k: v for k, v in data.items() if k != "sha256"}
    data["sha256"] = canonical_sha256(body)
    manifest.write_text(json.dumps(data))


def truncate(_m: Path, npz: Path) -> None:
    npz.write_bytes(npz.read_bytes()[:100])


def truncate_half(_m: Path, npz: Path) -> None:
    npz.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])


def truncate_manifest_half(m: Path, _n: Path) -> None:
    m.write_bytes(m.read_bytes()[: m.stat().st_size // 2])


def flip_byte(_m: Path, npz: Path) -> None:
    data = bytearray(npz.read_bytes())
    data[len(data) // 2] ^= 0x01
    npz.write_bytes(bytes(data))


def as_list(m: Path, _n: Path) -> None:
    m.write_text(json.dumps([json.loads(m.read_text())]))


def without_round(m: Path, _n: Path) -> None:
    data = json.loads(m.read_text())
    del data["round"]
    m.write_text(json.dumps(data))


def not_json(m: Path, _n: Path) -> None:
    m.write_text(m.read_text()[:-5])


def edit_state(m: Path, _n: Path) -> None:
    m.write_text(m.read_text().replace('"clock_s": 20.0', '"clock_s": 21.0'))


def edit_journal(m: Path, _n: Path) -> None:  # the file edited, the chain not redone
    path = m.parent / "journal.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace('"selected":[0,1]', '"selected":[0,2]')
    path.write_text("".join(lines))


def truncate_journal(m: Path, _n: Path) -> None:  # round 2's line lost
    path = m.parent / "journal.jsonl"
    path.write_text(path.read_text().splitlines(keepends=True)[0])


def edit_journal_reference(m: Path, _n: Path) -> None:
    m.write_text(m.read_text().replace('"entries": 2', '"entries": 1'))


def old_format(m: Path, n: Path) -> None:  # what the previous version wrote
    state = json.loads(m.read_text())["state"]
    old = {"round": 2, "model": n.name, "sha256": sha256_file(n), **state}
    m.write_text(json.dumps(old))


def pickled_model(m: Path, n: Path) -> None:  # checksums right, but the npz needs pickle
    bad = {"w": np.array([{"os": "system"}], dtype=object), "b": np.zeros(1, np.float32)}
    checkpoint.save(m.parent, 2, bad, json.loads(m.read_text())["state"])


def model_missing(_m: Path, n: Path) -> None:
    n.unlink()


def bad_journal_entry(m: Path, _n: Path) -> None:
    rechain(m.parent, lambda e: e.__setitem__(1, ["not", "an", "entry"]))


def journal_of_other_rounds(m: Path, _n: Path) -> None:
    rechain(m.parent, lambda e: e[1].__setitem__("round", 7))


def wrong_shape(m: Path, _n: Path) -> None:
    state = json.loads(m.read_text())["state"]
    checkpoint.save(m.parent, 2, {"w": np.zeros(4, np.float32), "b": np.zeros(1)}, state)


CASES = [
    (truncate, "model-checksum", "round-000002.npz"),
    (truncate_half, "model-checksum", "round-000002.npz"),
    (truncate_manifest_half, "malformed", "round-000002.json"),
    (flip_byte, "model-checksum", "round-000002.npz"),
    (model_missing, "unreadable", "round-000002.npz"),
    (as_list, "malformed", "round-000002.json"),
    (without_round, "malformed", "round-000002.json"),
    (not_json, "malformed", "round-000002.json"),
    (edit_state, "manifest-checksum", "round-000002.json"),
    (edit_journal, "journal-checksum", "journal.jsonl"),
    (truncate_journal, "journal-checksum", "journal.jsonl"),
    (edit_journal_reference, "manifest-checksum", "round-000002.json"),
    (old_format, "old-format", "round-000002.json"),
    (pickled_model, "model-format", "round-000002.npz"),
    (bad_journal_entry, "malformed", "round-000002.json"),
    (journal_of_other_rounds, "incompatible", "round-000002.json"),
    (wrong_shape, "incompatible", "round-000002.json"),
]


@pytest.mark.reliability("R7")
@pytest.mark.parametrize(("damage", "reason", "culprit"), CASES, ids=[c[0].__name__ for c in CASES])
def test_a_bad_newest_checkpoint_is_rejected_once_for_the_good_one_before(
    tmp_path, caplog, damage, reason, culprit
):
    manifest, npz = two_rounds(tmp_path)
    damage(manifest, npz)
    before = {r: rejected(r) for r in checkpoint_verify.REASONS}
    caplog.set_level(logging.WARNING, logger=LOGGER)
    ckpt = checkpoint.load_latest(tmp_path, _fits_run(params(0.0)))
    assert ckpt is not None and ckpt.round == 1
    np.testing.assert_array_equal(ckpt.params["w"], params(1.0)["w"])
    assert ckpt.state["clock_s"] == 10.0
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert culprit in lines[0] and reason in lines[0]
    after = {r: rejected(r) for r in checkpoint_verify.REASONS}
    assert {r: after[r] - before[r] for r in after if after[r] != before[r]} == {reason: 1}
    assert metrics.CHECKPOINT_LOADED_ROUND._value.get() == 1
    # set aside, so neither retried nor pruned in place of the good one
    assert sorted(p.name for p in tmp_path.glob("round-*.json")) == ["round-000001.json"]
    assert (tmp_path / "round-000002.json.rejected").exists()


def test_an_intact_checkpoint_round_trips_its_state(tmp_path):
    two_rounds(tmp_path)
    ckpt = checkpoint.load_latest(tmp_path, _fits_run(params(0.0)))
    assert ckpt is not None and ckpt.round == 2 and ckpt.state["clock_s"] == 20.0
    assert [e.round for e in _resume_state(ckpt).journal] == [1, 2]
    manifest = json.loads((tmp_path / "round-000002.json").read_text())
    assert {"sha256", "model_sha256", "state", "round"} <= manifest.keys()


def test_every_checkpoint_bad_refuses_to_start_and_leaves_them_in_place(tmp_path, caplog):
    manifest, npz = two_rounds(tmp_path)
    flip_byte(manifest, npz)
    as_list(tmp_path / "round-000001.json", tmp_path / "round-000001.npz")
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with pytest.raises(checkpoint.NoUsableCheckpoint, match="POWERTRIP_START_FRESH=1"):
        checkpoint.load_latest(tmp_path)
    assert len([r for r in caplog.records if r.name == LOGGER]) == 2  # one per checkpoint
    assert len(list(tmp_path.glob("round-*.json"))) == 2  # the next start sees them again


def test_every_checkpoint_bad_with_start_fresh_starts_at_round_0(tmp_path):
    manifest, npz = two_rounds(tmp_path)
    flip_byte(manifest, npz)
    truncate(tmp_path / "round-000001.json", tmp_path / "round-000001.npz")
    assert checkpoint.load_latest(tmp_path, start_fresh=True) is None
    assert list(tmp_path.glob("round-*.json")) == []
    # the fresh run's checkpoints are not pruned in favour of the bad, higher-numbered ones
    checkpoint.save(tmp_path, 1, params(1.0), {})
    assert checkpoint.load_latest(tmp_path).round == 1


def test_no_checkpoint_at_all_is_a_first_start(tmp_path):
    assert checkpoint.load_latest(tmp_path) is None
    assert checkpoint.load_latest(tmp_path / "missing") is None


def test_start_fresh_is_a_documented_setting():
    from powertrip.services.aggregator.config import AggregatorConfig
    from powertrip.services.common.command_line import env_help

    assert "POWERTRIP_START_FRESH" in env_help(AggregatorConfig)
