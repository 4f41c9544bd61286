"""`powertrip traces` as a user runs it: summaries of real and synthetic traces, a PNG, and a
one-line error with exit code 2 for a file that cannot be trusted."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli import run_powertrip
from tests.needs import real_data_reason

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def powertrip(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return run_powertrip(*args, tmp_path=tmp_path, timeout=120)


def ok(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    proc = powertrip("traces", *args, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture()
def google(shared_data) -> Path:
    d = shared_data / "google-power"
    if not (d / "cella_pdu6.csv").is_file():
        pytest.skip(real_data_reason("google-power"))
    return d


@pytest.fixture()
def mci(shared_data) -> Path:
    f = shared_data / "carbon" / "curtail-llm_mci_2026-01-11.csv"
    if not f.is_file():
        pytest.skip(real_data_reason("curtail-llm-mci"))
    return f


def test_power_folder_summary_lists_every_pdu_with_its_spare_power(google, tmp_path):
    proc = ok(str(google), tmp_path=tmp_path)

    for name in ("cella_pdu6", "cella_pdu7", "cella_pdu8", "cella_pdu9", "cella_pdu10"):
        assert name in proc.stdout
    assert "google-trace" in proc.stdout and "measured_power_util" in proc.stdout
    assert "0.285" in proc.stdout  # pdu6 mean spare, 1 - 0.715


def test_power_json_summary_and_plot(google, tmp_path):
    png = tmp_path / "power.png"

    proc = ok(str(google / "cella_pdu6.csv"), "--json", "--plot", str(png), tmp_path=tmp_path)

    doc = json.loads(proc.stdout)
    assert doc["kind"] == "power" and doc["label"] == "google-trace"
    (series,) = doc["series"]
    assert series["name"] == "cella_pdu6" and series["rows"] == 8928 and series["flagged"] == 0
    assert series["mean_spare"] == pytest.approx(0.285, abs=1e-3)
    assert series["min_spare"] == pytest.approx(1 - 0.771)
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_carbon_file_is_detected_and_its_windows_reported(mci, tmp_path):
    png = tmp_path / "carbon.png"

    proc = ok(str(mci), "--json", "--plot", str(png), tmp_path=tmp_path)

    doc = json.loads(proc.stdout)
    assert doc["kind"] == "carbon" and doc["threshold"] == 100 and doc["hold_s"] == 600
    regions = {r["name"]: r for r in doc["regions"]}
    assert regions["CAISO_NORTH"]["windows"] == [[300, 8100], [8400, 23700]]
    assert regions["DE"]["windows"] == [] and regions["DE"]["below_threshold_share"] == 0
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_carbon_table_uses_the_given_threshold_and_hold(mci, tmp_path):
    proc = ok(str(mci), "--threshold", "50", "--hold", "0", tmp_path=tmp_path)
    text = " ".join(proc.stdout.split())  # the table title may wrap
    assert "< 50 g/kWh" in text and "exit after 0 s above" in text
    assert "CAISO_NORTH" in text


@pytest.mark.parametrize(
    ("args", "label"),
    [
        (["--synthetic"], "synthetic-trace"),
        (["--synthetic", "--kind", "carbon"], "synthetic-carbon"),
    ],
)
def test_synthetic_traces_are_summarised_under_their_label(args, label, tmp_path):
    png = tmp_path / "s.png"
    proc = ok(*args, "--plot", str(png), tmp_path=tmp_path)
    assert label in proc.stdout
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_corrupt_power_file_exits_2_with_one_line_naming_file_and_line(google, tmp_path):
    lines = (google / "cella_pdu8.csv").read_text().splitlines()
    lines[41] = lines[41].rsplit(",", 1)[0] + ",1.7"  # physical line 42
    bad = tmp_path / "cella_pdu8.csv"
    bad.write_text("\r\n".join(lines))

    line = one_line_error(powertrip("traces", str(bad), tmp_path=tmp_path))

    assert str(bad) in line and "line 42" in line and "measured_power_util" in line
    assert "outside [0, 1]" in line


def test_corrupt_carbon_file_exits_2_with_one_line_naming_file_and_line(mci, tmp_path):
    lines = mci.read_text().splitlines()
    lines[10] = lines[10].replace("+00:00,", "+00:00,oops,", 1).rsplit(",", 1)[0]  # line 11
    bad = tmp_path / "mci.csv"
    bad.write_text("\n".join(lines) + "\n")

    line = one_line_error(powertrip("traces", str(bad), "--kind", "carbon", tmp_path=tmp_path))

    assert str(bad) in line and "line 11" in line and "not a number: 'oops'" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/nonexistent/trace.csv"], "no such file"),
        ([], "give trace files, or --synthetic"),
        (["--synthetic", "x.csv"], "not both"),
    ],
)
def test_bad_invocations_exit_2_with_one_line(args, message, tmp_path):
    assert message in one_line_error(powertrip("traces", *args, tmp_path=tmp_path))


def test_unknown_header_asks_for_kind(tmp_path):
    f = tmp_path / "what.csv"
    f.write_text("a,b\n1,2\n")
    assert "give --kind" in one_line_error(powertrip("traces", str(f), tmp_path=tmp_path))


def test_experiment_power_flags_are_validated_before_any_training(tmp_path):
    proc = powertrip(
        "experiment", "--power-model", "google-trace", "--output", str(tmp_path), tmp_path=tmp_path
    )
    assert "--power-model google-trace and --power-trace go together" in one_line_error(proc)


def test_traces_is_a_powertrip_command(tmp_path):
    proc = powertrip("--help", tmp_path=tmp_path)
    assert proc.returncode == 0 and "traces" in proc.stdout
