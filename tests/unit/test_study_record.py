"""The study's record of finished runs (runs.jsonl): what a resume reads back, how it survives a
crash in the middle of a line, and how it refuses a folder it cannot continue."""

from __future__ import annotations

import json

import pytest

from powertrip.study.record import RECORD, RecordError, StudyRecord, config_differences

CONFIG = {"name": "quick", "max_rounds": 4, "greedy": {"gamma": 0.5, "beta": 1.0}}


def opened(tmp_path, config=CONFIG, resume=True, execution=None) -> StudyRecord:
    return StudyRecord.open(tmp_path / "out", "ExperimentConfig", config, resume, execution)


def test_a_new_record_writes_nothing_until_its_first_run(tmp_path):
    record = opened(tmp_path, resume=False)
    assert record.created and not (tmp_path / "out").exists()

    record.add("static-2/repeat-0", {"accuracy": 0.1 + 0.2})

    lines = (tmp_path / "out" / RECORD).read_text().splitlines()
    assert json.loads(lines[0])["config"] == CONFIG
    assert json.loads(lines[1]) == {"run": "static-2/repeat-0", "accuracy": 0.1 + 0.2}


def test_runs_are_read_back_exactly_and_the_end_is_marked(tmp_path):
    first = opened(tmp_path, execution={"threads": 1, "device": "cpu"})
    first.add("a", {"x": [1 / 3, float("nan")]})
    first.close()
    again = opened(tmp_path)
    assert not again.created and len(again) == 1 and not again.complete
    assert again.get("a")["x"][0] == 1 / 3  # exact, not rounded
    assert again.execution == {"threads": 1, "device": "cpu"}
    again.finish()
    again.close()
    assert opened(tmp_path).complete


def test_a_line_torn_by_a_crash_is_dropped_and_cut_off(tmp_path):
    record = opened(tmp_path)
    record.add("a", {"x": 1})
    record.add("b", {"x": 2})
    record.close()
    path = tmp_path / "out" / RECORD
    whole = path.read_bytes()
    path.write_bytes(whole[:-5])  # the process died inside the last write

    resumed = opened(tmp_path)
    assert resumed.get("a") == {"run": "a", "x": 1} and resumed.get("b") is None
    resumed.add("b", {"x": 3})
    resumed.close()
    assert opened(tmp_path).get("b") == {"run": "b", "x": 3}


def test_a_record_of_no_run_is_started_over(tmp_path):
    opened(tmp_path, resume=False).finish()  # header and end only: no run worth keeping
    (tmp_path / "out" / RECORD).write_bytes(
        (tmp_path / "out" / RECORD).read_bytes().splitlines(keepends=True)[0]
    )
    record = opened(tmp_path, config={**CONFIG, "max_rounds": 9}, resume=False)
    assert record.created


def test_a_record_is_continued_only_when_asked(tmp_path):
    opened(tmp_path).add("a", {})
    with pytest.raises(RecordError, match=r"^holds a study already \(runs.jsonl\)$"):
        opened(tmp_path, resume=False)


def test_another_configuration_is_refused_naming_each_setting(tmp_path):
    opened(tmp_path).add("a", {})
    other = {"name": "quick", "max_rounds": 5, "greedy": {"gamma": 0.5, "beta": 2.0}}
    with pytest.raises(RecordError) as exc:
        opened(tmp_path, config=other)
    assert str(exc.value) == (
        "holds a study of another configuration: max_rounds 4 there, 5 now; "
        "greedy.beta 1.0 there, 2.0 now"
    )


def test_settings_only_one_side_has_are_named(tmp_path):
    assert config_differences({"a": 1}, {"a": 1, "b": None}) == ["b (unset) there, null now"]
    assert config_differences({"a": 1, "c": 2}, {"a": 1}) == ["c 2 there, (unset) now"]


def test_a_damaged_line_is_refused_naming_it(tmp_path):
    opened(tmp_path).add("a", {})
    path = tmp_path / "out" / RECORD
    path.write_bytes(path.read_bytes() + b"{not json}\n" + b'{"run": "b"}\n')
    with pytest.raises(RecordError, match=r"runs.jsonl line 3 is not JSON"):
        opened(tmp_path)


def test_a_record_of_another_study_is_refused(tmp_path):
    opened(tmp_path).add("a", {})
    with pytest.raises(RecordError, match="a record of 'ExperimentConfig'"):
        StudyRecord.open(tmp_path / "out", "CurtailmentConfig", CONFIG, True)


def test_a_record_is_written_by_one_process_at_a_time(tmp_path):
    running = opened(tmp_path, resume=False)
    running.add("a", {})
    with pytest.raises(RecordError, match=r"^is in use: another process is running the study"):
        opened(tmp_path)
    running.close()  # or the process ends, however it ends
    assert opened(tmp_path).get("a") == {"run": "a"}
