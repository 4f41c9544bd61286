"""Limits that keep a run finite and its outputs writable, checked before anything starts:
the curtailment study's timing fields, the static sweep against the site count, and the output
folder check the commands share (issue 12, item 6)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from powertrip.config.curtailment import build_curtail_config
from powertrip.config.experiment import build_config
from powertrip.services.cli.common import check_sweep, output_problem
from powertrip.services.common.config import CurtailSettings


def invalid_fields(**overrides: object) -> set[str]:
    with pytest.raises(ValidationError) as info:
        build_curtail_config("curtailment-quick", **overrides)
    return {str(e["loc"][0]) for e in info.value.errors()}


@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan])
def test_a_round_minimum_that_would_never_use_data_is_refused(value):
    # 0: the monitor may stop a round before its first step, so an always-on run never ends
    assert invalid_fields(round_min_s=value) == {"round_min_s"}


@pytest.mark.parametrize(
    "field",
    ["hours", "threshold", "hold_s", "provisioning_s", "overhead_s", "single_site_hours", "lr"],
)
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_timing_fields_must_be_finite(field, value):
    assert invalid_fields(**{field: value}) == {field}


def test_the_smallest_positive_round_minimum_and_zero_overhead_are_fine():
    cfg = build_curtail_config("curtailment-quick", round_min_s=1e-3, overhead_s=0.0, hold_s=0.0)
    assert cfg.round_min_s == 1e-3 and cfg.overhead_s == 0.0


def test_the_services_curtailment_config_gets_the_same_limits():
    with pytest.raises(ValidationError, match="hours"):
        CurtailSettings(curtail_hours=math.inf).curtail_config()
    with pytest.raises(ValidationError, match="round_min_s"):
        CurtailSettings().curtail_config(round_min_s=0)


def sweep_config(sweep: tuple[int, ...], **overrides: object):
    values = {"num_sites": 4, "policies": ("powertrip", "static-optimal"), "target_accuracy": 0.3}
    return build_config(None, static_sweep=sweep, **{**values, **overrides})


@pytest.mark.parametrize(
    "overrides",
    [{}, {"policies": ("random",)}, {"policies": ("powertrip",), "target_accuracy": None}],
)
def test_a_sweep_entirely_above_the_site_count_is_an_error_when_needed(overrides, capsys):
    with pytest.raises(SystemExit) as info:
        check_sweep(sweep_config((10, 20), **overrides))
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--sweep 10,20" in line and "--sites 4" in line


def test_sweep_values_above_the_site_count_are_dropped_with_one_warning(capsys):
    check_sweep(sweep_config((2, 4, 10, 20)))
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("warning:") and "10,20" in line and "--sites 4" in line


def test_an_unused_sweep_says_nothing(capsys):
    check_sweep(sweep_config((10, 20), policies=("powertrip",)))  # a target, no sweep policy
    check_sweep(sweep_config((2, 4)))
    assert capsys.readouterr().err == ""


def test_an_output_folder_is_checked_by_creating_it_and_then_removed(tmp_path):
    assert output_problem(tmp_path / "a" / "b" / "c") is None
    assert list(tmp_path.iterdir()) == []  # nothing left behind
    assert output_problem(tmp_path) is None


def test_an_output_folder_that_cannot_be_is_explained(tmp_path):
    (tmp_path / "file").write_text("x")
    assert output_problem(tmp_path / "file") == "exists and is not a folder"
    problem = output_problem(tmp_path / "file" / "sub" / "out")
    assert problem is not None and "Not a directory" in problem
    assert "cannot create" in (output_problem(Path("/proc/no-such/out")) or "")
