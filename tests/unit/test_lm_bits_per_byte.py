"""An LM study reports bits per byte, the unit its recipe is judged in (docs/workloads.md): in
the printed table, results.csv, rounds.csv and summary.json. With byte tokens it is the loss
per token over ln 2; with a BPE, the loss summed over the validation tokens over the bytes
they spell."""

from __future__ import annotations

import csv
import json
import math
import shlex

from click.testing import CliRunner

from powertrip.learning.datasets.text import load_text
from powertrip.learning.lm_eval import validation_bytes
from powertrip.services.cli.main import main as powertrip

TINY_LM = shlex.split(
    "--workload lm --n-layer 1 --d-model 32 --n-head 2 --context-length 16 --sites 2 "
    "--num-samples 200 --sweep 1,2 --policies select-all --max-rounds 2 --local-steps 2 "
    "--target 1 --no-plots"
)


def _rows(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_the_experiment_table_and_files_carry_bits_per_byte(tmp_path):
    out = tmp_path / "run"

    result = CliRunner().invoke(powertrip, ["experiment", *TINY_LM, "--output", str(out)])

    assert result.exit_code == 0, result.output
    rounds = _rows(out / "rounds.csv")
    for r in rounds:  # byte tokens: one byte per token
        assert math.isclose(float(r["bits_per_byte"]), float(r["loss"]) / math.log(2), rel_tol=1e-3)
    (run,) = _rows(out / "results.csv")
    final = float(rounds[-1]["bits_per_byte"])
    assert math.isclose(float(run["final_bits_per_byte"]), final, rel_tol=1e-3)
    assert "bits/byte (final)" in result.stdout and f"{final:.3f}" in result.stdout
    (quality,) = json.loads((out / "summary.json").read_text())["lm_quality"]
    assert math.isclose(quality["final_bits_per_byte"], final, rel_tol=1e-3)


def test_a_bpe_counts_the_bytes_its_validation_tokens_spell():
    bpe = load_text(None, context_length=16, max_samples=50, tokenizer="bpe-300")
    byte_tokens = load_text(None, context_length=16, max_samples=50)

    tokens, num_bytes = validation_bytes(bpe)

    assert tokens == bpe.y_test.numel() and num_bytes == bpe.val_bytes > tokens
    predicted = byte_tokens.y_test.numel()
    assert validation_bytes(byte_tokens) == (predicted, predicted)
