"""Google power traces: reading real and upstream-schema files, refusing corrupt ones with an
error that points at file/line/column, and replaying them as a PowerSource."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from powertrip.traces.io import TraceError
from powertrip.traces.power import (
    GOOGLE_LABEL,
    MEASURED,
    PRODUCTION,
    PowerSeries,
    PowerTrace,
    TracePower,
    read_power_file,
    read_power_trace,
)
from tests.needs import real_data_reason

UPSTREAM_HEADER = (
    "time,cell,pdu,measured_power_util,production_power_util,"
    "bad_measurement_data,bad_production_power_data"
)


def google_dir(shared_data: Path) -> Path:
    d = shared_data / "google-power"
    if not (d / "cella_pdu6.csv").is_file():
        pytest.skip(real_data_reason("google-power"))
    return d


def write(path: Path, lines: list[str], newline: str = "\n") -> Path:
    path.write_text(newline.join(lines) + newline)
    return path


def upstream_rows(n: int = 4, pdu: str = "pdu1", start_us: int = 600_000_000) -> list[str]:
    """n good 5-minute windows; measured util 0.60, 0.61, ... and production util 0.50, 0.51."""
    return [
        f"{start_us + k * 300_000_000},a,{pdu},{0.6 + k / 100:.2f},{0.5 + k / 100:.2f},False,False"
        for k in range(n)
    ]


# ------------------------------------------------------------------------- real reduced exports


def test_reads_the_five_real_pdus_with_crlf_index_column_and_missing_pdu_column(shared_data):
    # Prepare
    d = google_dir(shared_data)

    # Execute
    trace = read_power_trace(d)

    # Verify: every file, full month at 5 min, no production column so measured is used
    assert trace.names == ("cella_pdu10", "cella_pdu6", "cella_pdu7", "cella_pdu8", "cella_pdu9")
    assert trace.column == MEASURED
    assert trace.label == GOOGLE_LABEL
    for s in trace.series:
        assert s.rows == 8928 and s.flagged == 0
        assert s.time_s[0] == 600.0 and np.all(np.diff(s.time_s) == 300.0)
        assert s.span_s() == 31 * 86_400
    # SOURCE.md: mean measured utilisation pdu6 0.715, pdu10 0.736 (max 0.791)
    pdu6, pdu10 = trace.series[1], trace.series[0]
    assert pdu6.spare.mean() == pytest.approx(1 - 0.715, abs=1e-3)
    assert pdu10.spare.mean() == pytest.approx(1 - 0.736, abs=1e-3)
    assert pdu10.spare.min() == pytest.approx(1 - 0.791, abs=1e-9)
    assert pdu6.utilisation[0] == 0.659  # first data row of cella_pdu6.csv


def test_gzip_copy_reads_the_same_values(shared_data, tmp_path):
    # Prepare
    src = google_dir(shared_data) / "cella_pdu7.csv"
    gz = tmp_path / "cella_pdu7.csv.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))

    # Execute
    plain, _ = read_power_file(src)
    packed, _ = read_power_file(gz)

    # Verify
    assert packed[0].name == plain[0].name == "cella_pdu7"
    np.testing.assert_array_equal(packed[0].utilisation, plain[0].utilisation)


def test_asking_for_production_on_a_measured_only_export_names_the_missing_column(shared_data):
    d = google_dir(shared_data)
    with pytest.raises(TraceError, match="no 'production_power_util' column") as info:
        read_power_trace(d / "cella_pdu6.csv", column="production")
    assert info.value.line == 1 and "cella_pdu6.csv" in str(info.value)


# ------------------------------------------------------------------------- upstream schema


def test_upstream_schema_uses_production_by_default_and_measured_on_request(tmp_path):
    # Prepare
    f = write(tmp_path / "cella_pdu1.csv", [UPSTREAM_HEADER, *upstream_rows(3)])

    # Execute
    production = read_power_trace(f)
    measured = read_power_trace(f, column="measured")

    # Verify: spare = 1 - production_power_util unless told otherwise
    assert production.column == PRODUCTION and measured.column == MEASURED
    assert production.names == ("a/pdu1",)
    np.testing.assert_allclose(production.series[0].spare, [0.5, 0.49, 0.48])
    np.testing.assert_allclose(measured.series[0].spare, [0.4, 0.39, 0.38])
    np.testing.assert_allclose(production.series[0].time_s, [600, 900, 1200])


def test_flagged_rows_are_counted_and_dropped_for_their_own_column_only(tmp_path):
    # Prepare: window 2 has bad production data (empty value), window 3 bad measurement (NaN)
    rows = upstream_rows(4)
    rows[1] = "900000000,a,pdu1,0.61,,False,True"
    rows[2] = "1200000000,a,pdu1,nan,0.52,TRUE,false"
    f = write(tmp_path / "p.csv", [UPSTREAM_HEADER, *rows])

    # Execute
    production = read_power_trace(f).series[0]
    measured = read_power_trace(f, column="measured").series[0]

    # Verify
    assert (production.rows, production.flagged) == (4, 1)
    np.testing.assert_allclose(production.time_s, [600, 1200, 1500])
    assert (measured.rows, measured.flagged) == (4, 1)
    np.testing.assert_allclose(measured.time_s, [600, 900, 1500])


def test_several_pdus_in_one_file_become_separate_series(tmp_path):
    pairs = zip(upstream_rows(3, "pdu1"), upstream_rows(3, "pdu2"), strict=True)
    rows = [r for pair in pairs for r in pair]  # interleaved: pdu1, pdu2, pdu1, ...
    trace = read_power_trace(write(tmp_path / "cella.csv", [UPSTREAM_HEADER, *rows]))
    assert trace.names == ("a/pdu1", "a/pdu2")
    assert all(s.rows == 3 for s in trace.series)


def test_a_series_whose_every_row_is_flagged_is_an_error(tmp_path):
    rows = [r.replace(",False,False", ",False,True") for r in upstream_rows(2)]
    with pytest.raises(TraceError, match="every row of series 'a/pdu1' is flagged"):
        read_power_trace(write(tmp_path / "p.csv", [UPSTREAM_HEADER, *rows]))


def test_the_same_series_in_two_files_is_an_error(tmp_path):
    a = write(tmp_path / "a.csv", [UPSTREAM_HEADER, *upstream_rows(2)])
    b = write(tmp_path / "b.csv", [UPSTREAM_HEADER, *upstream_rows(2)])
    with pytest.raises(TraceError, match="'a/pdu1' was already read from"):
        read_power_trace([a, b])


# ------------------------------------------------------------------------- corrupted copies


def _lines(shared_data: Path) -> list[str]:
    return (google_dir(shared_data) / "cella_pdu6.csv").read_text().splitlines()


# (what is done to the real cella_pdu6.csv, expected line, column, message fragment)
CORRUPTIONS = [
    ("empty", 1, None, "empty file"),
    ("header only", 2, None, "header only"),
    ("truncated last line", 8929, None, "expected 4 fields"),
    ("non-numeric", 101, MEASURED, "not a number: 'n/a'"),
    ("NaN", 101, MEASURED, "NaN is not allowed"),
    ("above 1", 101, MEASURED, "1.2 outside [0, 1]"),
    ("negative", 101, MEASURED, "-0.1 outside [0, 1]"),
    ("missing value", 101, MEASURED, "missing value"),
    ("time goes back", 101, "time", "is not after"),
    ("repeated time", 101, "time", "is not after"),
    ("non-numeric time", 101, "time", "not a number"),
]


def corrupt(lines: list[str], how: str) -> str:
    """Text of the file after one deliberate corruption of data line 101 (or of the end)."""
    lines = list(lines)
    i = 100  # 0-based index of physical line 101 (header is line 1)
    idx, t, pdu, _ = lines[i].split(",")
    prev_t = lines[i - 1].split(",")[1]
    edits = {
        "non-numeric": f"{idx},{t},{pdu},n/a",
        "NaN": f"{idx},{t},{pdu},NaN",
        "above 1": f"{idx},{t},{pdu},1.2",
        "negative": f"{idx},{t},{pdu},-0.1",
        "missing value": f"{idx},{t},{pdu},",
        "time goes back": f"{idx},{int(prev_t) - 300_000_000},{pdu},0.7",
        "repeated time": f"{idx},{prev_t},{pdu},0.7",
        "non-numeric time": f"{idx},2019-05-01,{pdu},0.7",
    }
    if how == "empty":
        return ""
    if how == "header only":
        return lines[0] + "\r\n"
    if how == "truncated last line":
        return "\r\n".join(lines)[:-9]  # last row "...,pdu6,0.719" -> "...,p": 3 fields
    lines[i] = edits[how]
    return "\r\n".join(lines)


@pytest.mark.parametrize(("how", "line", "column", "message"), CORRUPTIONS)
def test_each_corruption_raises_a_trace_error_naming_file_line_and_column(
    shared_data, tmp_path, how, line, column, message
):
    # Prepare
    bad = tmp_path / "cella_pdu6.csv"
    bad.write_text(corrupt(_lines(shared_data), how), newline="")

    # Execute
    with pytest.raises(TraceError) as info:
        read_power_trace(bad)

    # Verify
    err = info.value
    assert (err.line, err.column) == (line, column)
    assert message in str(err)
    assert str(err).startswith(f"{bad}, line {line}")
    assert "\n" not in str(err)


def test_truncated_gzip_is_reported_not_crashed_on(shared_data, tmp_path):
    packed = gzip.compress((google_dir(shared_data) / "cella_pdu6.csv").read_bytes())
    bad = tmp_path / "cella_pdu6.csv.gz"
    bad.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(TraceError, match="truncated or corrupt gzip"):
        read_power_trace(bad)


def test_bad_boolean_flag_names_its_column(tmp_path):
    rows = upstream_rows(3)
    rows[1] = rows[1].removesuffix("False,False") + "False,maybe"
    with pytest.raises(TraceError, match="not a boolean") as info:
        read_power_trace(write(tmp_path / "p.csv", [UPSTREAM_HEADER, *rows]))
    assert (info.value.line, info.value.column) == (3, "bad_production_power_data")


def test_time_must_increase_within_a_series_not_across_series(tmp_path):
    # pdu2 restarting at the beginning of time is fine; pdu1 going back is not
    ok = [*upstream_rows(2, "pdu1"), *upstream_rows(2, "pdu2")]
    assert len(read_power_trace(write(tmp_path / "ok.csv", [UPSTREAM_HEADER, *ok])).series) == 2
    bad = [*upstream_rows(2, "pdu1"), *upstream_rows(2, "pdu1")]
    with pytest.raises(TraceError, match="times must increase") as info:
        read_power_trace(write(tmp_path / "bad.csv", [UPSTREAM_HEADER, *bad]))
    assert info.value.line == 4


def test_a_file_that_is_not_a_power_trace_is_refused(tmp_path):
    f = write(tmp_path / "x.csv", ["when,watts", "1,2"])
    with pytest.raises(TraceError, match="no 'time' column"):
        read_power_trace(f)


def test_a_directory_without_trace_files_is_refused(tmp_path):
    with pytest.raises(TraceError, match="no .csv"):
        read_power_trace(tmp_path)


# ------------------------------------------------------------------------- TracePower replay


def hand_trace() -> PowerTrace:
    """Domain 0: utilisation 0.1, 0.2, 0.3, 0.4 in four 5-min slots; domain 1: constant 0.5."""
    t = np.arange(4) * 300.0
    return PowerTrace(
        (
            PowerSeries("d0", t, np.array([0.1, 0.2, 0.3, 0.4])),
            PowerSeries("d1", t, np.full(4, 0.5)),
        ),
        PRODUCTION,
        GOOGLE_LABEL,
        "hand-made",
    )


def test_site_i_follows_domain_i_mod_n_from_a_whole_slot_offset():
    # Execute
    power = TracePower(hand_trace(), 5, np.random.default_rng(3))

    # Verify
    np.testing.assert_array_equal(power.domain, [0, 1, 0, 1, 0])
    assert np.all(power.offset_s % 300 == 0)
    assert np.all((power.offset_s >= 0) & (power.offset_s < 1200))
    np.testing.assert_allclose(power.power_at(0.0)[[1, 3]], 0.5)


def test_value_is_read_at_the_slot_containing_the_clock_and_wraps_at_the_trace_end():
    # Prepare
    power = TracePower(hand_trace(), 3, np.random.default_rng(0))
    spare = np.array([0.9, 0.8, 0.7, 0.6])

    for t in (0.0, 299.9, 300.0, 899.0, 1199.9, 1200.0, 1500.0, 12_345.0):
        # Execute
        got = power.power_at(t)

        # Verify: slot = (offset + t) // 300 mod 4, for both domain-0 sites
        for site in (0, 2):
            slot = int((power.offset_s[site] + t) // 300) % 4
            assert got[site] == pytest.approx(spare[slot]), (t, site)


def test_offsets_are_reproducible_from_the_seed_and_differ_between_sites():
    trace = hand_trace()
    a = TracePower(trace, 40, np.random.default_rng(7))
    b = TracePower(trace, 40, np.random.default_rng(7))
    np.testing.assert_array_equal(a.offset_s, b.offset_s)
    assert len(set(a.offset_s.tolist())) == 4  # 20 sites per domain cover all four slots
    np.testing.assert_array_equal(a.power_at(4321.0), b.power_at(4321.0))


def test_a_dropped_window_is_bridged_by_the_last_good_value():
    # the 300 s window was flagged and dropped: 300..599 s reads the 0 s window
    s = PowerSeries("d", np.array([0.0, 600.0, 900.0]), np.array([0.1, 0.3, 0.4]), flagged=1)
    trace = PowerTrace((s,), PRODUCTION, GOOGLE_LABEL, "hand-made")
    power = TracePower(trace, 1, np.random.default_rng(0))
    start = float(power.offset_s[0])
    readings = [power.power_at(t - start)[0] for t in (0.0, 300.0, 599.0, 600.0, 900.0)]
    np.testing.assert_allclose(readings, [0.9, 0.9, 0.9, 0.7, 0.6])


def test_power_is_clipped_to_a_positive_floor():
    s = PowerSeries("full", np.array([0.0, 300.0]), np.array([1.0, 0.995]))
    trace = PowerTrace((s,), PRODUCTION, GOOGLE_LABEL, "hand-made")
    power = TracePower(trace, 2, np.random.default_rng(0), floor=0.01)
    assert np.all(power.power_at(0.0) >= 0.01) and np.all(power.power_at(300.0) >= 0.01)
    with pytest.raises(ValueError, match="floor"):
        TracePower(trace, 2, np.random.default_rng(0), floor=0.0)


def test_real_trace_replay_stays_within_the_real_spare_range(shared_data):
    trace = read_power_trace(google_dir(shared_data))
    power = TracePower(trace, 100, np.random.default_rng(0))
    values = np.stack([power.power_at(t) for t in np.arange(0, 7 * 86_400, 3_600.0)])
    assert values.shape == (168, 100)
    assert values.min() > 0.2 and values.max() < 0.4  # SOURCE.md: utilisation 0.611-0.791
    assert values.std(axis=0).min() > 0  # every site's power moves over a week
