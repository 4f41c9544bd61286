"""The round journal beside the checkpoints: a manifest stays the same size however long the
run, the journal file is appended one hash-chained line per round and read back whole; a
checkpoint that verifies but carries a field of the wrong type is rejected with one line naming
the file and the field, and the previous good one loads instead of a crash loop."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from powertrip.journal import JournalEntry
from powertrip.rounds import RoundOutcome
from powertrip.services.aggregator import checkpoint, checkpoint_verify
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.durable_files import canonical_sha256
from powertrip.services.aggregator.journal_file import NAME, JournalFile
from powertrip.services.aggregator.resume import fits_run, journal_writer, resume_state
from powertrip.services.common.config import load_config

LOGGER = "powertrip.services.aggregator.checkpoint"
SITES = 50


def params(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full(8, value, np.float32), "b": np.full(1, value, np.float32)}


def entry(r: int) -> dict:
    """Round ``r`` as a real run journals it: 20 of 50 sites, every probe measured."""
    rng = np.random.default_rng(r)
    f = [float(x) for x in rng.random(8)]
    selected = tuple(sorted(int(s) for s in rng.choice(SITES, 20, replace=False)))
    outcome = RoundOutcome(f[0], f[1], (f[2], f[3], 20.0), 20, f[4], f[5], projection=(f[6], f[7]))
    return JournalEntry(r, selected, outcome, unavailable=(4, 7) if r == 2 else ()).to_json()


def state(r: int) -> dict:
    return {"clock_s": 60.5 * r, "accuracy": 0.5, "policy": "powertrip", "initial": [0.1, 2.3]}


def run_rounds(directory: Path, rounds: int, save_at: set[int]) -> JournalFile:
    """Journal ``rounds`` rounds, checkpointing (the real save path) at the rounds ``save_at``
    and appending the journal every round in between, as the run does."""
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
    journal = (tmp_path / NAME).stat().st_size
    ckpt = checkpoint.load_latest(tmp_path, fits_run(params(0.0), SITES))
    assert ckpt is not None and ckpt.round == 10_000
    assert [e.round for e in resume_state(ckpt, SITES).journal] == list(range(1, 10_001))
    assert resume_state(ckpt, SITES).down == {2: [4, 7]}
    # rounds: a few more digits in the journal reference and the state, nothing per round
    small = tmp_path / "small"
    run_rounds(small, 10, set(range(1, 11)))
    assert abs(manifest - (small / "round-000010.json").stat().st_size) <= 16
    assert manifest < 600
    # the history is in the journal file instead: one line per round
    assert len((tmp_path / NAME).read_bytes().splitlines()) == 10_000
    assert journal > 1000 * (small / NAME).stat().st_size * 0.9


@pytest.mark.reliability("R30")
def test_a_save_writes_as_many_bytes_at_round_10000_as_at_round_10(tmp_path):
    """The per-round cost: what one save appends and rewrites does not depend on the round."""
    journal = run_rounds(tmp_path, 9_999, {10, 9_999})

    def written(r: int) -> int:
        before = (tmp_path / NAME).stat().st_size
        journal.extend([entry(r)])
        checkpoint.save(tmp_path, r, params(float(r)), state(r), journal)
        return (
            (tmp_path / NAME).stat().st_size
            - before
            + (tmp_path / f"round-{r:06d}.json").stat().st_size
        )

    late = written(10_000)
    early_dir = tmp_path / "early"
    journal = run_rounds(early_dir, 10, {10})
    before = (early_dir / NAME).stat().st_size
    journal.extend([entry(11)])
    checkpoint.save(early_dir, 11, params(11.0), state(11), journal)
    early = (
        (early_dir / NAME).stat().st_size
        - before
        + (early_dir / "round-000011.json").stat().st_size
    )
    assert abs(late - early) <= 24, (early, late)


def test_lines_a_crash_left_past_the_committed_prefix_are_ignored_then_cut_off(tmp_path):
    run_rounds(tmp_path, 3, {1, 2, 3})
    with (tmp_path / NAME).open("ab") as f:
        f.write(b'{"entry":{"round":4,"sel')  # a crash in the middle of round 4's append
    ckpt = checkpoint.load_latest(tmp_path, fits_run(params(0.0), SITES))
    assert ckpt is not None and ckpt.round == 3
    writer = journal_writer(tmp_path, ckpt)
    writer.extend([entry(4)])
    checkpoint.save(tmp_path, 4, params(4.0), state(4), writer)
    again = checkpoint.load_latest(tmp_path, fits_run(params(0.0), SITES))
    assert [e["round"] for e in again.state["journal"]] == [1, 2, 3, 4]
    assert len((tmp_path / NAME).read_bytes().splitlines()) == 4


def test_a_format_2_checkpoint_still_loads_and_the_next_save_moves_its_journal_out(tmp_path):
    journal = [entry(1), entry(2)]
    for e in journal:
        e.pop("unavailable", None)  # format 2 kept the masks beside the journal
    st = {**state(2), "journal": journal, "unavailable": {"2": [4, 7]}}
    checkpoint.save(tmp_path, 2, params(2.0), st)
    manifest = tmp_path / "round-000002.json"
    data = json.loads(manifest.read_text())
    data["format"] = 2
    data["sha256"] = canonical_sha256({k: v for k, v in data.items() if k != "sha256"})
    manifest.write_text(json.dumps(data))
    ckpt = checkpoint.load_latest(tmp_path, fits_run(params(0.0), SITES))
    assert ckpt is not None and ckpt.round == 2 and ckpt.journal is None
    assert resume_state(ckpt, SITES).down == {2: [4, 7]}
    writer = journal_writer(tmp_path, ckpt)
    writer.extend([entry(3)])
    checkpoint.save(tmp_path, 3, params(3.0), state(3), writer)
    latest = json.loads((tmp_path / "round-000003.json").read_text())
    assert latest["format"] == checkpoint_verify.FORMAT
    assert latest["state"]["journal"]["entries"] == 3
    resumed = resume_state(checkpoint.load_latest(tmp_path, fits_run(params(0.0), SITES)), SITES)
    assert [e.round for e in resumed.journal] == [1, 2, 3] and resumed.down == {2: [4, 7]}


# -- a checksum-valid checkpoint with a field of the wrong type ---------------------------------
def resign(manifest: Path, edit) -> None:
    """Edit the manifest's JSON and recompute its self-checksum, as a buggy writer or someone
    with write access to the directory would leave it."""
    data = json.loads(manifest.read_text())
    edit(data)
    data["sha256"] = canonical_sha256({k: v for k, v in data.items() if k != "sha256"})
    manifest.write_text(json.dumps(data))


def forge_entry(directory: Path, r: int, edit) -> None:
    """Edit round ``r``'s journal entry, rewrite the file with its hash chain redone, and
    re-sign the newest manifest's reference to it: every checksum agrees."""
    lines = (directory / NAME).read_bytes().splitlines()
    entries = [json.loads(line)["entry"] for line in lines]
    edit(entries[r - 1])
    (directory / NAME).unlink()
    writer = JournalFile(directory)
    writer.extend(entries)
    ref = writer.sync().to_json()
    resign(directory / "round-000003.json", lambda d: d["state"].__setitem__("journal", ref))


def set_state(key: str, value: object):
    return lambda d: resign(d / "round-000003.json", lambda m: m["state"].__setitem__(key, value))


def set_field(key: str, value: object, r: int = 3):
    return lambda d: forge_entry(d, r, lambda e: e.__setitem__(key, value))


def set_outcome(key: str, value: object):
    return lambda d: forge_entry(d, 3, lambda e: e["outcome"].__setitem__(key, value))


FORGED = [
    ("round-string", set_field("round", "x"), "malformed", "round is a str"),
    ("selected-number", set_field("selected", 5), "malformed", "selected"),
    ("selected-bool", set_field("selected", [True, 2]), "malformed", "selected"),
    ("selected-out-of-run", set_field("selected", [3, SITES]), "incompatible", "selects a site"),
    ("accuracy-string", set_outcome("accuracy", "0.9"), "malformed", "accuracy"),
    ("dispersion-short", set_outcome("dispersion", [1.0]), "malformed", "dispersion"),
    ("contributions-float", set_outcome("contributions", 2.5), "malformed", "contributions"),
    ("outcome-list", set_field("outcome", [0.5]), "malformed", "outcome"),
    ("unavailable-string", set_field("unavailable", "4"), "malformed", "unavailable"),
    ("unavailable-out-of-run", set_field("unavailable", [-1]), "incompatible", "unavailable"),
    ("unknown-field", set_field("surprise", 1), "malformed", "surprise"),
    ("clock-string", set_state("clock_s", "181.5"), "malformed", "clock_s"),
    ("accuracy-state-null", set_state("accuracy", None), "malformed", "accuracy"),
    ("initial-strings", set_state("initial", ["0.1", "2.3"]), "malformed", "initial"),
    ("policy-number", set_state("policy", 3), "malformed", "policy"),
    ("masks-map-broken", set_state("unavailable", {"3": "x"}), "malformed", "unavailable"),
    ("masks-map-round", set_state("unavailable", {"x": [1]}), "incompatible", "unavailable"),
    ("journal-ref-string", set_state("journal", "journal.jsonl"), "malformed", "journal"),
    ("journal-ref-count", set_state("journal", {"entries": "3", "bytes": 1, "sha256": "0" * 64}),
     "malformed", "entries"),
]  # fmt: skip


@pytest.mark.reliability("R30")
@pytest.mark.parametrize(
    ("forge", "reason", "field"), [f[1:] for f in FORGED], ids=[f[0] for f in FORGED]
)
def test_a_signed_checkpoint_with_a_field_of_the_wrong_type_falls_back_to_the_one_before(
    tmp_path, caplog, forge, reason, field
):
    run_rounds(tmp_path, 3, {2, 3})
    forge(tmp_path)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    ckpt = checkpoint.load_latest(tmp_path, fits_run(params(0.0), SITES))  # does not raise
    assert ckpt is not None and ckpt.round == 2
    resumed = resume_state(ckpt, SITES)  # what the aggregator then replays: well-typed
    assert [e.round for e in resumed.journal] == [1, 2] and resumed.initial == (0.1, 2.3)
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "round-000003.json" in line and reason in line and field in line and "\n" not in line
    assert (tmp_path / "round-000003.json.rejected").exists()


@pytest.mark.reliability("R30")
def test_the_aggregator_starts_from_the_round_before_a_signed_checkpoint_it_cannot_use(
    tmp_path, caplog
):
    """The real aggregator run, built as its entry point builds it: no crash loop."""
    from powertrip.services.aggregator.run import AggregatorRun

    env = {
        "POWERTRIP_PROFILER_ADDR": "127.0.0.1:1",  # never reached while the run is built
        "POWERTRIP_INSECURE": "1",
        "POWERTRIP_NUM_SITES": "3",
        "POWERTRIP_NUM_SAMPLES": "400",
        "POWERTRIP_CHECKPOINT_DIR": str(tmp_path),
    }
    cfg = load_config(AggregatorConfig, env)
    first = AggregatorRun(cfg)  # nothing to resume: the run's own model, for its checkpoints
    model = first.executor.params
    first.executor.close()
    journal = JournalFile(tmp_path)
    for r in (1, 2):
        journal.extend([{"round": r, "selected": [0, 1, 2], "outcome": None}])
        checkpoint.save(tmp_path, r, model, state(r), journal)
    resign(tmp_path / "round-000002.json", lambda m: m["state"].__setitem__("accuracy", "0.9"))
    caplog.set_level(logging.WARNING, logger=LOGGER)
    run = AggregatorRun(cfg)
    run.executor.close()
    assert run._resumed_round == 1 and run.journaled.replaying(1) and not run.journaled.replaying(2)
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "round-000002.json" in line and "malformed" in line and "state.accuracy" in line
    # its next round goes to the journal with the availability mask it ran under, after
    # round 1's line (round 2's forged line cut off), and the masks held in memory are let go
    run.liveness.down[2] = [1]
    run.journaled._new.append(JournalEntry(2, (0, 2), None))
    run._stage_journal(2)
    assert run._writer is not None
    run._writer.submit(2, model, state(2))
    assert run._writer.wait() is True
    assert run.liveness.down == {}
    resumed = resume_state(checkpoint.load_latest(tmp_path, run._fits), 3)
    assert [(e.round, e.selected) for e in resumed.journal] == [(1, (0, 1, 2)), (2, (0, 2))]
    assert resumed.down == {2: [1]}
