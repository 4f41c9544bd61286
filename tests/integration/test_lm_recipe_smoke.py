"""The LM benchmarks (benchmarks/bench_lm_recipe.py, bench_lm_diloco.py) must not rot: a few
steps of each row on a small generated text, and the tables they print have their columns."""

from __future__ import annotations

import json

from powertrip.learning.datasets.text import synthetic_corpus
from tests.integration.test_benchmark_smoke import run_benchmark


def test_the_lm_recipe_benchmark_prints_every_row_with_bits_per_byte(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(synthetic_corpus(20_000))
    out = run_benchmark(
        "bench_lm_recipe.py",
        "--data",
        str(corpus),
        "--steps",
        "8",
        "--seeds",
        "0,1",
        timeout_s=300,
    )
    lines = out.strip().splitlines()
    header = lines.index(next(line for line in lines if line.startswith("recipe")))
    assert lines[header].split()[-4:] == ["nats/token", "nats/byte", "bits/byte", "s/run"]
    rows = {line.split()[0]: line.split() for line in lines[header + 1 :]}
    assert set(rows) == {"sgd", "adamw", "adamw-4x"}
    for row in rows.values():
        bits = [float(v) for v in row[6].split("/")]  # min/median/max over the two seeds
        assert len(bits) == 3 and 0 < bits[0] <= bits[1] <= bits[2] < 9  # log2(256) = 8 at chance
    assert rows["adamw"][3] == rows["adamw-4x"][3]  # same bytes seen


def test_the_diloco_benchmark_trains_single_and_four_site_rows_on_equal_bytes(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(synthetic_corpus(40_000))
    report = tmp_path / "diloco.json"
    run_benchmark(
        "bench_lm_diloco.py",
        "--data",
        str(corpus),
        "--steps",
        "8",
        "--json",
        str(report),
        "--rows",
        "single,diloco-H10-reset,fedavg-H50",
        timeout_s=300,
    )
    rows = json.loads(report.read_text())
    assert list(rows) == ["single", "diloco-H10-reset", "fedavg-H50"]
    for row in rows.values():
        assert 0 < row["bits_per_byte"] < 9  # log2(256) = 8 at chance
        seen = [bytes_seen for bytes_seen, _ in row["curve"]]
        assert seen[-1] == 8 * 12 * 64  # every row sees the budget's bytes, no more
