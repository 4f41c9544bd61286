"""Checkpoints: every file is checksummed, and a bad checkpoint is rejected (one log line, one
count) for the previous good one; none good refuses to start unless told to start fresh. A
checkpoint holds the run's identity and its components' states (arrays in the npz), and the round
journal beside it is history: no damage to it rejects a checkpoint."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from powertrip.rounds.clock import EmulatedClock
from powertrip.rounds.loop import RoundLoop, TimeModel
from powertrip.selection.registry import build_policy
from powertrip.services.aggregator import checkpoint, checkpoint_verify, metrics
from powertrip.services.aggregator.durable_files import canonical_sha256, sha256_file
from powertrip.services.aggregator.executor import GrpcRoundExecutor
from powertrip.services.aggregator.journal_file import JournalFile
from powertrip.services.aggregator.resume import fits_run

RUN = "ab" * 32  # the run digest the checkpoints below are written under


def params(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full(3, value, np.float32), "b": np.full(1, value, np.float32)}


def test_load_round_reads_the_kept_fallback_and_not_a_pruned_round(tmp_path):
    for r in (1, 2, 3):
        checkpoint.save(tmp_path, r, params(float(r)), state(r))
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


def fresh_policy_and_loop(name: str = "oort") -> tuple:
    policy = build_policy(name)
    loop = RoundLoop(policy, None, None, TimeModel(1.0, 1.0), EmulatedClock(), 0, None, 10**6)
    return policy, loop


def components(r: int) -> dict:
    """A run's component states after round ``r`` (Oort's hold arrays: they go in the npz)."""
    policy, loop = fresh_policy_and_loop()
    policy.state.utility = {3: 0.5 * r, 1: 2.0}
    policy.state.last_round = {3: r, 1: 1}
    loop.round, loop.accuracy, loop.loss, loop.initial = r, 0.5, 1.5, (0.1, 2.3)
    loop.clock.resume_at(10.0 * r)
    return {"policy": policy.state_dict(), "loop": loop.state_dict()}


def state(r: int) -> dict:
    return {
        "run": RUN,
        "clock_s": 10.0 * r,
        "accuracy": 0.5,
        "policy": "oort",
        "components": components(r),
    }


def restore(c) -> None:
    """What the aggregator's check does: load the components into throwaway objects."""
    policy, loop = fresh_policy_and_loop()
    if set(c) != {"policy", "loop"}:
        raise ValueError(f"components {sorted(c)} are not this run's")
    policy.load_state_dict(c["policy"])
    loop.load_state_dict(c["loop"])


def fits(template: dict | None = None):
    return fits_run(params(0.0) if template is None else template, RUN, restore)


def two_rounds(directory: Path) -> tuple[Path, Path]:
    """Rounds 1 and 2 with a journal; the paths of round 2's manifest and model."""
    journal = JournalFile(directory)
    for r in (1, 2):
        journal.extend([entry(r)])
        checkpoint.save(directory, r, params(float(r)), state(r), journal)
    return directory / "round-000002.json", directory / "round-000002.npz"


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


def old_format(m: Path, n: Path) -> None:  # what the first version wrote
    state = json.loads(m.read_text())["state"]
    old = {"round": 2, "model": n.name, "sha256": sha256_file(n), **state}
    m.write_text(json.dumps(old))


def format_3(m: Path, _n: Path) -> None:  # resumed by replaying the journal: no policy state
    rewrite(m, lambda d: d.__setitem__("format", 3))


def other_run(m: Path, _n: Path) -> None:  # another configuration's or seed's checkpoint
    rewrite(m, lambda d: d["state"].__setitem__("run", "cd" * 32))


def policy_field_string(m: Path, _n: Path) -> None:
    rewrite(
        m, lambda d: d["state"]["components"]["policy"]["utility"].__setitem__("threshold", "x")
    )


def policy_of_another_kind(m: Path, _n: Path) -> None:  # a greedy policy's field in Oort's
    rewrite(m, lambda d: d["state"]["components"]["policy"].__setitem__("k", 3))


def loop_rng_broken(m: Path, _n: Path) -> None:
    rewrite(m, lambda d: d["state"]["components"]["loop"].__setitem__("rng", {"state": 1}))


def array_reference_dangling(m: Path, _n: Path) -> None:
    utility = lambda d: d["state"]["components"]["policy"]["utility"]  # noqa: E731
    rewrite(m, lambda d: utility(d).__setitem__("sites", {checkpoint.ARRAY_REF: 99}))


def journal_deleted(m: Path, _n: Path) -> None:  # history only: never costs a checkpoint
    (m.parent / "journal.jsonl").unlink()


def pickled_model(m: Path, n: Path) -> None:  # checksums right, but the npz needs pickle
    bad = {"w": np.array([{"os": "system"}], dtype=object), "b": np.zeros(1, np.float32)}
    checkpoint.save(m.parent, 2, bad, state(2))


def model_missing(_m: Path, n: Path) -> None:
    n.unlink()


def wrong_shape(m: Path, _n: Path) -> None:
    checkpoint.save(m.parent, 2, {"w": np.zeros(4, np.float32), "b": np.zeros(1)}, state(2))


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
    (old_format, "old-format", "round-000002.json"),
    (format_3, "old-format", "round-000002.json"),
    (pickled_model, "model-format", "round-000002.npz"),
    (wrong_shape, "incompatible", "round-000002.json"),
    (other_run, "other-run", "round-000002.json"),
    (policy_field_string, "malformed", "round-000002.json"),
    (policy_of_another_kind, "incompatible", "round-000002.json"),
    (loop_rng_broken, "incompatible", "round-000002.json"),
    (array_reference_dangling, "malformed", "round-000002.json"),
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
    ckpt = checkpoint.load_latest(tmp_path, fits())
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


def test_an_intact_checkpoint_round_trips_its_state_arrays_in_the_npz(tmp_path):
    two_rounds(tmp_path)
    ckpt = checkpoint.load_latest(tmp_path, fits())
    assert ckpt is not None and ckpt.round == 2 and ckpt.state["clock_s"] == 20.0
    utility = ckpt.state["components"]["policy"]["utility"]
    np.testing.assert_array_equal(utility["sites"], [3, 1])
    np.testing.assert_array_equal(utility["utility"], [1.0, 2.0])
    policy, loop = fresh_policy_and_loop()
    policy.load_state_dict(ckpt.state["components"]["policy"])
    loop.load_state_dict(ckpt.state["components"]["loop"])
    assert policy.state.utility == {3: 1.0, 1: 2.0} and loop.clock.now() == 20.0
    manifest = json.loads((tmp_path / "round-000002.json").read_text())
    assert {"sha256", "model_sha256", "state", "round"} <= manifest.keys()
    assert manifest["state"]["components"]["policy"]["utility"]["sites"] == {"__array__": 0}
    assert sorted(checkpoint.STATE + k for k in "012") == sorted(
        k for k in np.load(tmp_path / "round-000002.npz").files if k.startswith("__state__")
    )


@pytest.mark.reliability("R34")
def test_a_deleted_journal_rejects_no_checkpoint(tmp_path, caplog):
    manifest, npz = two_rounds(tmp_path)
    journal_deleted(manifest, npz)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    ckpt = checkpoint.load_latest(tmp_path, fits())
    assert ckpt is not None and ckpt.round == 2
    assert [r for r in caplog.records if r.name == LOGGER] == []


def test_every_checkpoint_of_another_run_refuses_to_start_in_one_line(tmp_path):
    manifest, npz = two_rounds(tmp_path)
    other_run(manifest, npz)
    other_run(tmp_path / "round-000001.json", tmp_path / "round-000001.npz")
    with pytest.raises(checkpoint.NoUsableCheckpoint) as refused:
        checkpoint.load_latest(tmp_path, fits())
    message = str(refused.value)
    assert "\n" not in message and "another run" in message and str(tmp_path) in message
    assert "POWERTRIP_START_FRESH=1" in message


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
