"""TensorBoard export (issue 13): what a study's CSVs say is what TensorBoard reads back, with
the emulated run clock as the wall time; bad input and a missing package fail in one line."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from powertrip.study.tracking import INSTALL_HINT, TrackingError, export_tensorboard, read_runs

needs_tensorboard = pytest.mark.extra("tensorboard")
START = 1_700_000_000.0


def _write(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _scalars(run_dir: Path) -> dict[str, list]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def _text(run_dir: Path) -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()


EXPERIMENT_HEADER = ["policy", "repeat", "round", "time_seconds", "duration_seconds", "sites"]
EXPERIMENT_HEADER += ["accuracy", "loss", "selected"]


def _experiment_dir(tmp_path: Path) -> Path:
    out = tmp_path / "exp"
    _write(
        out / "rounds.csv",
        EXPERIMENT_HEADER,
        [
            ["powertrip", 0, 1, "100.000", "100.000", 3, "0.2000", "2.0000", "site-000 site-001"],
            ["powertrip", 0, 2, "150.500", "50.500", 2, "0.4000", "1.5000", "site-000"],
            ["powertrip", 1, 1, "80.000", "80.000", 1, "0.3000", "1.8000", "site-002"],
        ],
    )
    _write(
        out / "results.csv",
        ["policy", "repeat", "seed", "time_to_accuracy_seconds", "rounds"],
        [["powertrip", 0, 7, "150.500", 2], ["powertrip", 1, 8, "", ""]],
    )
    (out / "summary.json").write_text(
        json.dumps({"config": {"name": "tiny"}, "target_accuracy": 0.4})
    )
    return out


@needs_tensorboard
def test_each_run_reads_back_with_round_steps_and_the_run_clock_as_wall_time(tmp_path):
    runs = export_tensorboard(_experiment_dir(tmp_path), tmp_path / "tb", start=START)

    assert sorted(p.relative_to(tmp_path / "tb").as_posix() for p in runs) == [
        "powertrip/repeat-0",
        "powertrip/repeat-1",
    ]
    got = _scalars(tmp_path / "tb" / "powertrip" / "repeat-0")
    acc = got["accuracy"]
    assert [e.step for e in acc] == [1, 2]
    assert [e.value for e in acc] == pytest.approx([0.2, 0.4])
    assert [e.wall_time - START for e in acc] == pytest.approx([100.0, 150.5])
    assert [e.value for e in got["loss"]] == pytest.approx([2.0, 1.5])
    assert [e.value for e in got["round/sites_selected"]] == [3, 2]
    assert [e.value for e in got["round/duration_seconds"]] == pytest.approx([100.0, 50.5])
    # the clock itself, anchored at 0 so Relative starts at the run's start
    clock = got["clock/seconds"]
    assert [e.step for e in clock] == [0, 1, 2]
    assert [e.wall_time - START for e in clock] == pytest.approx([0.0, 100.0, 150.5])
    assert [e.value for e in clock] == pytest.approx([0.0, 100.0, 150.5])
    [tta] = got["summary/time_to_accuracy_seconds"]
    assert (tta.step, tta.value) == (2, pytest.approx(150.5))
    text = _text(tmp_path / "tb" / "powertrip" / "repeat-0")
    assert "0.0418 h (round 2)" in text and '"name": "tiny"' in text and "0.4" in text
    missed = _scalars(tmp_path / "tb" / "powertrip" / "repeat-1")
    assert "summary/time_to_accuracy_seconds" not in missed
    assert "target not reached" in _text(tmp_path / "tb" / "powertrip" / "repeat-1")


@needs_tensorboard
def test_a_real_study_exports_what_its_rounds_csv_says(tmp_path):
    from powertrip.config.experiment import build_config
    from powertrip.study.powertrip import run_study
    from powertrip.study.results import write_outputs

    cfg = build_config(
        "quick",
        num_sites=4,
        num_samples=400,
        partition="iid",
        static_sweep=(2, 4),
        policies=("powertrip",),
        max_rounds=3,
        target_accuracy=0.15,
        repeats=2,
    )
    write_outputs(run_study(cfg), tmp_path / "out")
    export_tensorboard(tmp_path / "out", tmp_path / "tb", start=START)

    rows = _csv(tmp_path / "out" / "rounds.csv")
    for key in {(r["policy"], r["repeat"]) for r in rows}:
        mine = [r for r in rows if (r["policy"], r["repeat"]) == key]
        got = _scalars(tmp_path / "tb" / key[0] / f"repeat-{key[1]}")
        acc = got["accuracy"]
        assert [e.step for e in acc] == [int(r["round"]) for r in mine]
        assert [e.value for e in acc] == pytest.approx([float(r["accuracy"]) for r in mine])
        clock = [float(r["time_seconds"]) for r in mine]
        walls = [e.wall_time for e in acc]
        # wall-time deltas are run-clock deltas, not the seconds the emulation took
        assert [b - a for a, b in zip(walls, walls[1:], strict=False)] == pytest.approx(
            [b - a for a, b in zip(clock, clock[1:], strict=False)], abs=1e-3
        )
        assert walls[0] - START == pytest.approx(clock[0], abs=1e-3)
    text = _text(tmp_path / "tb" / "powertrip" / "repeat-0")
    assert '"num_sites": 4' in text


@needs_tensorboard
def test_curtailment_runs_carry_their_energy_and_emissions(tmp_path):
    out = tmp_path / "cur"
    _write(
        out / "rounds.csv",
        ["run", "round", "start_s", "train_start_s", "stop_s", "end_s", "sites"]
        + ["batches_per_site", "samples", "left", "accuracy", "loss"],
        [
            ["curtailment", 1, "0", "45", "645", "2611.4", "a;b;c", "1;1;1", 96, "", "0.1", "2.3"],
            ["curtailment", 2, "3000", "3045", "3645", "4000", "a", "1", 32, "", "0.2", "2.2"],
        ],
    )
    _write(
        out / "runs.csv",
        ["run", "time_to_accuracy_hours", "energy_kwh", "emissions_kg", "curtailed_energy_share"],
        [["curtailment", "1.0", "36.5", "2.0", "0.9"]],
    )

    export_tensorboard(out, tmp_path / "tb", start=START)

    got = _scalars(tmp_path / "tb" / "curtailment" / "repeat-0")
    assert [e.wall_time - START for e in got["accuracy"]] == pytest.approx([2611.4, 4000.0])
    assert [e.value for e in got["round/duration_seconds"]] == pytest.approx([2611.4, 1000.0])
    assert [e.value for e in got["round/sites_selected"]] == [3, 1]
    assert [e.value for e in got["round/samples"]] == [96, 32]
    for tag, value in [
        ("energy_kwh", 36.5),
        ("emissions_kg", 2.0),
        ("time_to_accuracy_seconds", 3600),
    ]:
        [e] = got[f"summary/{tag}"]
        assert (e.step, e.wall_time - START, e.value) == (
            2,
            pytest.approx(4000.0),
            pytest.approx(value),
        )


def test_an_up_rounds_csv_is_one_run_at_repeat_0(tmp_path):
    path = _write(
        tmp_path / "up" / "rounds.csv",
        ["policy", "round", "time_seconds", "duration_seconds", "sites", "contributions"]
        + ["accuracy", "loss", "outcome", "selected"],
        [["powertrip", 1, "12.5", "12.5", 4, 4, "0.3", "1.9", "completed", "site-000"]],
    )

    runs, config = read_runs(path)

    assert config is None
    [run] = runs
    assert run.name == "powertrip/repeat-0"
    assert run.rounds[0].scalars["round/contributions"] == 4
    assert run.rounds[0].clock_s == 12.5


def test_bad_input_fails_in_one_line_naming_file_line_and_field(tmp_path):
    with pytest.raises(TrackingError, match="no such file or folder"):
        read_runs(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrackingError, match="has no rounds.csv"):
        read_runs(tmp_path / "empty")
    out = _experiment_dir(tmp_path)
    rows = (out / "rounds.csv").read_text().splitlines()
    rows[2] = rows[2].replace("0.4000", "oops")
    (out / "rounds.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(TrackingError) as err:
        read_runs(out)
    assert (
        str(err.value) == f"{out / 'rounds.csv'} line 3: field 'accuracy': 'oops' is not a number"
    )
    _write(out / "rounds.csv", ["policy", "round"], [["x", 1]])
    with pytest.raises(TrackingError, match="line 1: missing column"):
        read_runs(out)


def test_a_policy_name_cannot_leave_the_logdir(tmp_path):
    path = _write(
        tmp_path / "rounds.csv",
        EXPERIMENT_HEADER,
        [["../../evil", 0, 1, "1.0", "1.0", 1, "0.1", "1.0", ""]],
    )
    [run] = read_runs(path)[0]
    assert run.name == ".._.._evil/repeat-0"
    assert "/" not in run.name.split("/repeat-")[0]


def test_without_tensorboard_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(TrackingError, match=r"pip install 'powertrip\[tensorboard\]'"):
        export_tensorboard(_experiment_dir(tmp_path), tmp_path / "tb")
    assert not (tmp_path / "tb").exists()


@needs_tensorboard
def test_a_re_export_replaces_the_event_files(tmp_path):
    out = _experiment_dir(tmp_path)
    export_tensorboard(out, tmp_path / "tb")
    export_tensorboard(out, tmp_path / "tb")
    assert len(list((tmp_path / "tb" / "powertrip" / "repeat-0").iterdir())) == 1
    assert len(_scalars(tmp_path / "tb" / "powertrip" / "repeat-0")["accuracy"]) == 2


@needs_tensorboard
def test_the_export_command_writes_next_to_the_results(tmp_path):
    from powertrip.services.cli.main import main

    out = _experiment_dir(tmp_path)
    res = CliRunner().invoke(main, ["export-tensorboard", str(out)])
    assert res.exit_code == 0, res.output
    assert "2 run(s)" in res.output and "tensorboard --logdir" in res.output
    assert _scalars(out / "tensorboard" / "powertrip" / "repeat-1")["accuracy"][0].step == 1

    res = CliRunner().invoke(
        main, ["export-tensorboard", str(out), "--logdir", str(tmp_path / "x")]
    )
    assert res.exit_code == 0 and (tmp_path / "x" / "powertrip" / "repeat-0").is_dir()


def test_the_export_command_fails_in_one_line(tmp_path):
    from powertrip.services.cli.main import main

    res = CliRunner().invoke(main, ["export-tensorboard", str(tmp_path / "nowhere")])
    assert res.exit_code == 2
    assert "no such file or folder" in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["experiment", "curtail"])
def test_a_study_with_tensorboard_missing_fails_before_it_runs(tmp_path, monkeypatch, command):
    from powertrip.services.cli.main import main

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    args = [command, "--output", str(tmp_path / "o"), "--tensorboard", str(tmp_path / "t")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and INSTALL_HINT in res.output
    assert not (tmp_path / "o").exists()
