"""Carbon-intensity traces and curtailment windows (the curtailment paper's rule): the real WattTime
and Electricity Maps samples, corrupted copies, and the enter/exit-hysteresis rule on hand-made
series."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from powertrip.traces.carbon import (
    SYNTHETIC_LABEL,
    carbon_format,
    curtailment_windows,
    curtailment_windows_of,
    read_carbon_trace,
    read_electricitymaps_csv,
    read_watttime_csv,
    synthetic_carbon_trace,
)
from powertrip.traces.io import TraceError
from tests.needs import data_set_of, real_data_reason

MIN = 60.0


def carbon_file(shared_data: Path, name: str) -> Path:
    f = shared_data / "carbon" / name
    if not f.is_file():
        pytest.skip(real_data_reason(data_set_of(f"carbon/{name}")))
    return f


def minutes(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(start, duration) in minutes, easier to compare with SOURCE.md."""
    return [(a / MIN, (b - a) / MIN) for a, b in windows]


# ------------------------------------------------------------------------- real samples


def test_curtailment_paper_trace_reads_four_regions_at_five_minutes(shared_data):
    # Execute
    trace = read_carbon_trace(carbon_file(shared_data, "curtail-llm_mci_2026-01-11.csv"))

    # Verify
    assert trace.regions == ("CAISO_NORTH", "SPP_TX", "NEM_SA", "DE")
    assert trace.time_s.size == 217 and trace.step_s == 300
    assert trace.start == datetime(2026, 1, 11, 17, tzinfo=UTC)
    assert trace.end_s == 18 * 3600 + 300
    assert trace.series("CAISO_NORTH")[1] == pytest.approx(68.945984)
    assert trace.label == "watttime-mci"


def test_plain_threshold_windows_match_the_published_counts(shared_data):
    # SOURCE.md: below 100 g/kWh CAISO_NORTH has windows of 120 and 245 min, SPP_TX 10, 365
    # and 35, NEM_SA one of 630, DE none. hold 0 is the plain threshold.
    trace = read_carbon_trace(carbon_file(shared_data, "curtail-llm_mci_2026-01-11.csv"))

    windows = curtailment_windows(trace, threshold=100.0, hold_s=0.0)

    assert [d for _, d in minutes(windows["CAISO_NORTH"])] == [120, 245]
    assert [d for _, d in minutes(windows["SPP_TX"])] == [10, 365, 35]
    assert [d for _, d in minutes(windows["NEM_SA"])] == [630]
    assert windows["DE"] == []


def test_hysteresis_windows_match_the_logged_run_timeline(shared_data):
    # The logged run: CA provisioned at 287 s, its MCI rose above θ near 7490 s, deprovisioned at
    # 8125 s (after 10 min), curtailed again at 8391 s; SA joined at 17 025 s (incl. ~240 s
    # provisioning). The logged times add polling and overhead, hence the tolerances.
    trace = read_carbon_trace(carbon_file(shared_data, "curtail-llm_mci_2026-01-11.csv"))

    windows = curtailment_windows(trace)  # θ = 100, hold 600 s

    (ca1_start, ca1_end), (ca2_start, _) = windows["CAISO_NORTH"]
    assert ca1_start == 300 and abs(ca1_start - 287) < 60
    assert ca1_end == 7500 + 600 and abs(ca1_end - 8125) < 60
    assert ca2_start == 8400 and abs(ca2_start - 8391) < 60
    assert abs(windows["NEM_SA"][0][0] + 240 - 17_025) < 60
    # SPP_TX's 10-min gap between its first windows is shorter than the hold: one window
    assert len(windows["SPP_TX"]) == 1


def test_watttime_month_reads_and_has_the_published_window_count(shared_data):
    f = carbon_file(shared_data, "watttime_caiso-north_2023-06-08_2023-07-08.csv")

    trace = read_watttime_csv(f)

    assert trace.regions == ("Caiso_North",) and trace.time_s.size == 8928
    assert trace.intensity.min() == pytest.approx(35.4, abs=0.05)
    assert trace.intensity.max() == pytest.approx(462.7, abs=0.05)
    assert np.mean(trace.intensity < 100) == pytest.approx(0.167, abs=0.001)
    assert len(curtailment_windows(trace, hold_s=0.0)["Caiso_North"]) == 101
    # the hold merges windows separated by <= 10 min above the threshold
    assert len(curtailment_windows(trace)["Caiso_North"]) < 101


def test_electricity_maps_hourly_export_reads_zone_direct_and_lca(shared_data):
    f = carbon_file(shared_data, "electricitymaps/US-CAL-CISO_2023_hourly.csv")

    direct = read_electricitymaps_csv(f)
    lca = read_carbon_trace(f, basis="lca")

    assert direct.regions == ("US-CAL-CISO",) and direct.step_s == 3600
    assert direct.time_s.size == 8760
    # SOURCE.md: CISO-2023 direct CI min/mean/max 54.9/193.5/330.8
    assert direct.intensity.min() == pytest.approx(54.9, abs=0.05)
    assert direct.intensity.mean() == pytest.approx(193.5, abs=0.05)
    assert direct.intensity.max() == pytest.approx(330.8, abs=0.05)
    assert lca.intensity.mean() > direct.intensity.mean()  # life-cycle adds upstream emissions
    assert direct.label == "electricitymaps-direct" and lca.label == "electricitymaps-lca"
    assert direct.flagged[0] >= 0


def test_estimated_rows_are_counted_as_flagged(tmp_path):
    header = (
        "Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
        "Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,"
        "Data Source,Data Estimated,Data Estimation Method"
    )
    rows = [
        f"2023-01-01 0{h}:00:00,Spain,Spain,ES,{v},{v + 50},50,40,x,{est},"
        for h, v, est in ((0, 120.0, "false"), (1, 90.0, "true"), (2, 80.0, "true"))
    ]
    f = tmp_path / "ES_2023_hourly.csv"
    f.write_text("\r\n".join([header, *rows]) + "\r\n", encoding="utf-8")

    trace = read_carbon_trace(f)

    assert trace.flagged == (2,)
    np.testing.assert_allclose(trace.series("ES"), [120, 90, 80])


# ------------------------------------------------------------------------- corrupted copies

WT_HEADER = "point_time,CAISO_NORTH,SPP_TX"
WT_ROWS = [
    "2026-01-11 17:00:00+00:00,463.5,617.7",
    "2026-01-11 17:05:00+00:00,68.9,631.8",
    "2026-01-11 17:10:00+00:00,63.9,631.8",
]

# (replacement for data row 2 = physical line 3, column, message fragment)
WT_CORRUPTIONS = [
    ("2026-01-11 17:05:00+00:00,abc,631.8", "CAISO_NORTH", "not a number: 'abc'"),
    ("2026-01-11 17:05:00+00:00,68.9,nan", "SPP_TX", "NaN is not allowed"),
    ("2026-01-11 17:05:00+00:00,-3,631.8", "CAISO_NORTH", "negative intensity"),
    ("yesterday,68.9,631.8", "point_time", "not an ISO timestamp"),
    ("2026-01-11 16:55:00+00:00,68.9,631.8", "point_time", "does not increase"),
    ("2026-01-11 17:00:00+00:00,68.9,631.8", "point_time", "does not increase"),
    ("2026-01-11 17:05:00+00:00,68.9", None, "expected 3 fields"),
]


@pytest.mark.parametrize(("row", "column", "message"), WT_CORRUPTIONS)
def test_each_watttime_corruption_names_line_and_column(tmp_path, row, column, message):
    f = tmp_path / "mci.csv"
    f.write_text("\n".join([WT_HEADER, WT_ROWS[0], row, WT_ROWS[2]]) + "\n")

    with pytest.raises(TraceError) as info:
        read_carbon_trace(f)

    assert (info.value.line, info.value.column) == (3, column)
    assert message in str(info.value) and str(info.value).startswith(f"{f}, line 3")


def test_truncated_last_line_of_the_real_trace_is_named(shared_data, tmp_path):
    text = carbon_file(shared_data, "curtail-llm_mci_2026-01-11.csv").read_text()
    bad = tmp_path / "mci.csv"
    bad.write_text(text.rstrip("\n")[:-40])  # cut into the last row's region values
    with pytest.raises(TraceError, match="expected 5 fields") as info:
        read_carbon_trace(bad)
    assert info.value.line == 218


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [("", 1, "empty file"), (WT_HEADER + "\n", 2, "header only"), ("a,b\n1,2\n", 1, "not a")],
)
def test_empty_header_only_and_unknown_files_are_refused(tmp_path, text, line, message):
    f = tmp_path / "c.csv"
    f.write_text(text)
    with pytest.raises(TraceError, match=message) as info:
        read_carbon_trace(f)
    assert info.value.line == line


def test_format_is_told_by_header():
    assert carbon_format(["point_time", "CAISO_NORTH"]) == "watttime"
    assert carbon_format(["time", "Caiso_North"]) == "watttime"
    assert carbon_format(["Datetime (UTC)", "Zone Id", "Carbon Intensity g (direct)"]) == (
        "electricitymaps"
    )
    assert carbon_format(["time", "cell", "pdu", "measured_power_util"]) is None
    assert carbon_format(["index", "time", "measured_power_util"]) is None


# ------------------------------------------------------------------------- hysteresis rule

STEP = 300.0


def windows_of(values: list[float], hold_s: float = 600.0, threshold: float = 100.0):
    t = np.arange(len(values)) * STEP
    v = np.asarray(values, float)
    return curtailment_windows_of(t, v, len(values) * STEP, threshold, hold_s)


def test_enters_at_the_first_sample_below_and_leaves_after_the_hold_above():
    # below at 300 and 600 s; above from 900 s on for longer than the hold -> leaves at 1500 s
    assert windows_of([200, 50, 50, 200, 200, 200, 200]) == [(300.0, 1500.0)]


def test_a_short_rise_above_the_threshold_does_not_end_the_window():
    # above for 300 s only (900..1200), then below again: one window to the trace end
    assert windows_of([50, 50, 50, 200, 50, 50]) == [(0.0, 1800.0)]


def test_falling_back_to_the_threshold_exactly_at_the_hold_clears_the_mark():
    # marked at 300 s; at 900 s (= mark + hold) it is back below: the site stays
    assert windows_of([50, 200, 200, 50, 50]) == [(0.0, 1500.0)]
    # still above at 900 s: leaves at 900 s
    assert windows_of([50, 200, 200, 200, 50]) == [(0.0, 900.0), (1200.0, 1500.0)]


def test_intensity_equal_to_the_threshold_neither_enters_nor_marks():
    assert windows_of([100, 100, 100]) == []
    assert windows_of([50, 100, 100, 100], hold_s=0.0) == [(0.0, 1200.0)]


def test_a_mark_near_the_end_of_the_trace_closes_at_the_end():
    assert windows_of([50, 50, 200]) == [(0.0, 900.0)]  # mark at 600, hold would end at 1200
    assert windows_of([50, 50, 200], hold_s=100.0) == [(0.0, 700.0)]


def test_zero_hold_gives_exactly_the_runs_below_the_threshold():
    rng = np.random.default_rng(5)
    values = rng.uniform(0, 200, size=400)
    below = values < 100
    runs, start = [], None
    for k, b in enumerate(below.tolist() + [False]):
        if b and start is None:
            start = k
        elif not b and start is not None:
            runs.append((start * STEP, k * STEP))
            start = None

    assert windows_of(values.tolist(), hold_s=0.0) == runs


def test_longer_holds_only_lengthen_and_merge_windows():
    rng = np.random.default_rng(6)
    values = rng.uniform(0, 200, size=400).tolist()
    plain = windows_of(values, hold_s=0.0)
    held = windows_of(values, hold_s=900.0)
    assert len(held) < len(plain)
    covered = sum(b - a for a, b in held)
    assert covered > sum(b - a for a, b in plain)
    for a, b in plain:  # every plain window lies inside a held one
        assert any(ha <= a and b <= hb for ha, hb in held)


def test_negative_hold_is_refused():
    with pytest.raises(ValueError, match="hold"):
        windows_of([50], hold_s=-1)


def test_intensity_at_holds_each_sample_until_the_next():
    trace = synthetic_carbon_trace(hours=1.0, step_s=600.0)
    np.testing.assert_array_equal(trace.intensity_at(599.0), trace.intensity[:, 0])
    np.testing.assert_array_equal(trace.intensity_at(600.0), trace.intensity[:, 1])
    np.testing.assert_array_equal(trace.intensity_at(1e9), trace.intensity[:, -1])


# ------------------------------------------------------------------------- synthetic carbon


def test_synthetic_carbon_is_labelled_deterministic_and_has_windows():
    a = synthetic_carbon_trace(seed=1)
    b = synthetic_carbon_trace(seed=1)
    c = synthetic_carbon_trace(seed=2)

    assert a.label == SYNTHETIC_LABEL == "synthetic-carbon"
    np.testing.assert_array_equal(a.intensity, b.intensity)
    assert not np.array_equal(a.intensity, c.intensity)
    assert a.intensity.shape == (3, 288) and a.intensity.min() > 0
    assert any(curtailment_windows(a).values())
