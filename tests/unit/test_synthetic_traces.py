"""The embedded synthetic power trace (the stand-in for the Google traces) and trace-driven power in
the study: calibrated statistics, determinism, and the "synthetic-trace" label reaching the
outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from powertrip.config.experiment import PRESETS, build_config
from powertrip.sites.power_model import build_power
from powertrip.sites.profiles import StaticPower, generate_sites
from powertrip.study.powertrip import StudyResult
from powertrip.study.results import write_outputs
from powertrip.traces.power import SYNTHETIC_LABEL, PowerTrace, TracePower
from powertrip.traces.synthetic import DAY_S, synthetic_power_trace
from tests.needs import real_data_reason


@pytest.fixture(scope="module")
def trace() -> PowerTrace:
    return synthetic_power_trace(seed=0)


def test_default_is_ten_domains_of_one_month_at_five_minutes(trace):
    assert len(trace.series) == 10
    for s in trace.series:
        assert s.time_s.size == 31 * 288
        assert np.all(np.diff(s.time_s) == 300.0)
        assert s.flagged == 0


def test_the_label_travels_with_the_trace_and_its_power_source(trace):
    assert trace.label == SYNTHETIC_LABEL == "synthetic-trace"
    assert TracePower(trace, 3, np.random.default_rng(0)).label == "synthetic-trace"


def test_mean_spare_is_evenly_spaced_over_26_to_51_percent(trace):
    means = np.array([s.spare.mean() for s in trace.series])
    np.testing.assert_allclose(means, np.linspace(0.26, 0.51, 10), atol=0.01)


def test_values_stay_within_the_clip_range(trace):
    spare = np.concatenate([s.spare for s in trace.series])
    assert spare.min() >= 0.2 - 1e-12 and spare.max() <= 0.6 + 1e-12
    assert spare.min() == pytest.approx(0.2)  # the lowest domain does touch the floor


def test_diurnal_term_has_five_point_amplitude_and_noise_is_ar1_with_sigma_002(trace):
    # domain 5 (mean ~0.40) never reaches the clip, so its signal is exactly sine + noise
    s = trace.series[5]
    w = 2 * np.pi * s.time_s / DAY_S
    design = np.column_stack([np.ones_like(w), np.sin(w), np.cos(w)])
    coef, *_ = np.linalg.lstsq(design, s.spare, rcond=None)
    residual = s.spare - design @ coef

    assert np.hypot(coef[1], coef[2]) == pytest.approx(0.05, abs=0.005)
    assert residual.std() == pytest.approx(0.02, abs=0.004)
    lag1 = np.corrcoef(residual[:-1], residual[1:])[0, 1]
    assert lag1 == pytest.approx(0.95, abs=0.03)


def test_same_seed_same_trace_other_seed_other_trace():
    a = synthetic_power_trace(num_domains=3, days=2, seed=11)
    b = synthetic_power_trace(num_domains=3, days=2, seed=11)
    c = synthetic_power_trace(num_domains=3, days=2, seed=12)
    for x, y in zip(a.series, b.series, strict=True):
        np.testing.assert_array_equal(x.utilisation, y.utilisation)
    assert not np.array_equal(a.series[0].utilisation, c.series[0].utilisation)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"num_domains": 0}, "power domain"), ({"ar_coef": 1.0}, "AR"), ({"days": 0}, "shorter")],
)
def test_impossible_parameters_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        synthetic_power_trace(**kwargs)


# ------------------------------------------------------------------------- the study's power


def test_uniform_stays_the_default_power_model():
    cfg = build_config("quick")
    power, label = build_power(cfg, generate_sites(cfg.num_sites, np.random.default_rng(0)))
    assert isinstance(power, StaticPower) and label.startswith("uniform")


def test_paper_traces_preset_is_paper_uniform_with_synthetic_trace_power():
    uniform, traces = PRESETS["paper-uniform"], PRESETS["paper-traces"]
    assert traces["power_model"] == "synthetic-trace"
    assert {k: v for k, v in traces.items() if k not in ("description", "power_model")} == {
        k: v for k, v in uniform.items() if k != "description"
    }


def test_synthetic_trace_power_varies_over_time_and_is_fixed_by_the_site_seed():
    cfg = build_config("paper-traces", num_sites=20)
    sites = generate_sites(20, np.random.default_rng(cfg.site_seed))

    power, label = build_power(cfg, sites)
    again, _ = build_power(cfg, sites)

    assert label == "synthetic-trace"
    day = np.stack([power.power_at(t) for t in np.arange(0, DAY_S, 1800.0)])
    assert day.std(axis=0).min() > 0.01  # every site's power moves within a day
    assert day.min() >= 0.2 - 1e-12 and day.max() <= 0.6 + 1e-12
    np.testing.assert_array_equal(power.power_at(12_345.0), again.power_at(12_345.0))


def test_google_trace_power_reads_the_given_files(shared_data):
    d = shared_data / "google-power"
    if not d.is_dir():
        pytest.skip(real_data_reason("google-power"))
    cfg = build_config("quick", power_trace_path=d)  # a trace path implies google-trace

    power, label = build_power(cfg, generate_sites(cfg.num_sites, np.random.default_rng(0)))

    assert cfg.power_model == "google-trace"
    assert label == "google-trace (measured_power_util, 5 domains)"
    assert np.all((power.power_at(0.0) > 0.2) & (power.power_at(0.0) < 0.4))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"power_model": "google-trace"}, "go together"),
        ({"power_model": "synthetic-trace", "power_trace_path": "x.csv"}, "go together"),
        ({"power_trace_path": "/nonexistent/trace"}, "does not exist"),
        ({"power_model": "sunshine"}, "power_model"),
    ],
)
def test_inconsistent_power_settings_are_configuration_errors(overrides, message):
    with pytest.raises(ValidationError, match=message):
        build_config("quick", **overrides)


def test_summary_and_results_say_which_power_was_used(tmp_path):
    cfg = build_config("quick", power_model="synthetic-trace")
    sites = generate_sites(cfg.num_sites, np.random.default_rng(0))
    result = StudyResult(cfg, sites, 0.5, None, power_label="synthetic-trace")

    paths = write_outputs(result, tmp_path)

    summary = json.loads(paths["summary"].read_text())
    assert summary["power_model"] == "synthetic-trace"
    assert summary["config"]["power_model"] == "synthetic-trace"
    assert ",power_model," in paths["results"].read_text().splitlines()[0]
