"""The local optimizer flags of `powertrip experiment` and `powertrip curtail`: folded into one
validated recipe that the summary records, and bad values refused in one line naming the flag.

One real run goes through the installed command; refusals happen before any training, so they
are checked in-process (click's runner), which spares a Python-and-torch start per value."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from powertrip.config.experiment import build_config
from powertrip.services.cli.main import main as powertrip
from powertrip.study.files import summary_header
from tests.cli import run_powertrip

TINY = [
    "--sites",
    "4",
    "--sweep",
    "2,4",
    "--max-rounds",
    "2",
    "--target",
    "0.3",
    "--policies",
    "static-optimal",
    "--repeats",
    "1",
    "--no-plots",
]


def test_an_adamw_recipe_trains_and_is_written_to_the_summary(tmp_path):
    out = tmp_path / "run"
    flags = [
        "--optimizer",
        "adamw",
        "--lr",
        "0.002",
        "--weight-decay",
        "0.1",
        "--lr-schedule",
        "cosine",
        "--warmup-steps",
        "2",
        "--total-steps",
        "50",
        "--local-clip-norm",
        "1.0",
        "--outer",
        "nesterov",
        "--outer-lr",
        "0.5",
    ]
    proc = run_powertrip("experiment", *TINY, *flags, "--output", str(out), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    recipe = json.loads((out / "summary.json").read_text())["config"]["local_optimizer"]
    assert recipe["name"] == "adamw" and recipe["schedule"] == "cosine"
    assert (recipe["weight_decay"], recipe["clip_norm"], recipe["keep_state"]) == (0.1, 1.0, True)
    config = json.loads((out / "summary.json").read_text())["config"]
    assert (config["lr"], config["outer"], config["outer_lr"]) == (0.002, "nesterov", 0.5)


def test_without_flags_the_summary_has_no_recipe():
    assert "local_optimizer" not in summary_header(build_config(None))["config"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["experiment", *TINY, "--local-clip-norm", "0"], ["--local-clip-norm"]),
        (["experiment", *TINY, "--lr", "-1"], ["--lr"]),
        (["experiment", *TINY, "--outer-momentum", "1.5"], ["--outer-momentum"]),
        (["experiment", *TINY, "--outer-lr", "0"], ["--outer-lr"]),
        (["curtail", "--lr-schedule", "wsd"], ["total_steps is required"]),
    ],
)
def test_bad_values_are_refused_in_one_line_naming_the_flag(tmp_path, args, words):
    result = CliRunner().invoke(powertrip, [*args, "--output", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # a click error, not a traceback
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for w in words:
        assert w in result.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written
