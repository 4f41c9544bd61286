"""The local optimizer flags of `powertrip experiment` and `powertrip curtail`: folded into one
validated recipe that the summary records, and bad values refused in one line naming the flag."""

from __future__ import annotations

import json

from tests.cli import run_powertrip

TINY = ["--sites", "4", "--sweep", "2,4", "--max-rounds", "2", "--target", "0.3",
        "--policies", "static-optimal", "--repeats", "1", "--no-plots"]  # fmt: skip


def test_an_adamw_recipe_trains_and_is_written_to_the_summary(tmp_path):
    out = tmp_path / "run"
    flags = ["--optimizer", "adamw", "--lr", "0.002", "--weight-decay", "0.1",
             "--lr-schedule", "cosine", "--warmup-steps", "2", "--total-steps", "50",
             "--local-clip-norm", "1.0", "--outer", "nesterov", "--outer-lr", "0.5"]  # fmt: skip
    proc = run_powertrip(
        "experiment", *TINY, *flags, "--output", str(out), tmp_path=tmp_path
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    recipe = json.loads((out / "summary.json").read_text())["config"]["local_optimizer"]
    assert recipe["name"] == "adamw" and recipe["schedule"] == "cosine"
    assert (recipe["weight_decay"], recipe["clip_norm"], recipe["keep_state"]) == (0.1, 1.0, True)
    config = json.loads((out / "summary.json").read_text())["config"]
    assert (config["lr"], config["outer"], config["outer_lr"]) == (0.002, "nesterov", 0.5)


def test_without_flags_the_summary_has_no_recipe(tmp_path):
    out = tmp_path / "run"
    proc = run_powertrip("experiment", *TINY, "--output", str(out), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "local_optimizer" not in json.loads((out / "summary.json").read_text())["config"]


def test_bad_values_are_refused_naming_the_flag(tmp_path):
    bad = run_powertrip("experiment", *TINY, "--local-clip-norm", "0", tmp_path=tmp_path)
    assert bad.returncode == 2 and "--local-clip-norm" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    for flag, value in (("--lr", "-1"), ("--outer-momentum", "1.5"), ("--outer-lr", "0")):
        bad = run_powertrip("experiment", *TINY, flag, value, tmp_path=tmp_path)
        assert bad.returncode == 2 and flag in bad.stderr, (flag, bad.stderr)
    schedule = run_powertrip("curtail", "--lr-schedule", "wsd", tmp_path=tmp_path)
    assert schedule.returncode == 2 and "total_steps is required" in schedule.stderr
