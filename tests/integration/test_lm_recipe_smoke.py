"""The LM recipe benchmark (benchmarks/bench_lm_recipe.py) must not rot: a few steps of each
row on a small generated text, and the table it prints has its columns."""

from __future__ import annotations

from powertrip.learning.datasets.text import synthetic_corpus
from tests.integration.test_benchmark_smoke import run_benchmark


def test_the_lm_recipe_benchmark_prints_every_row_with_bits_per_byte(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(synthetic_corpus(60_000))
    out = run_benchmark(
        "bench_lm_recipe.py", "--data", str(corpus), "--steps", "8", "--seeds", "0,1",
        timeout_s=300,
    )  # fmt: skip
    lines = out.strip().splitlines()
    header = lines.index(next(line for line in lines if line.startswith("recipe")))
    assert lines[header].split()[-4:] == ["nats/token", "nats/byte", "bits/byte", "s/run"]
    rows = {line.split()[0]: line.split() for line in lines[header + 1 :]}
    assert set(rows) == {"sgd", "adamw", "adamw-4x"}
    for row in rows.values():
        bits = [float(v) for v in row[6].split("/")]  # min/median/max over the two seeds
        assert len(bits) == 3 and 0 < bits[0] <= bits[1] <= bits[2] < 9  # log2(256) = 8 at chance
    assert rows["adamw"][3] == rows["adamw-4x"][3]  # same bytes seen
