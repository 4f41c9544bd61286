"""The study's figures say what happened: a static-k that never reached the target is drawn as
such (Fig. 8's valley keeps its walls), error bars appear only with repeats to take a spread
over, and each bar carries its ratio to static-optimal (Fig. 9)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from powertrip.config.experiment import build_config
from powertrip.sites.profiles import generate_sites
from powertrip.study.plots import draw_static_sweep, draw_tta_bars, write_plots
from powertrip.study.powertrip import RunSummary, StudyResult

H = 3600.0


def _summary(policy: str, repeat: int, tta_h: float | None) -> RunSummary:
    return RunSummary(
        policy=policy,
        repeat=repeat,
        seed=repeat,
        time_to_accuracy_s=None if tta_h is None else tta_h * H,
        rounds=None if tta_h is None else 10,
        rounds_run=20,
        mean_sites=5.0,
        max_sites=8,
        final_accuracy=0.5,
        best_accuracy=0.5,
    )


def _result(repeats: int, tta: dict[str, list[float | None]]) -> StudyResult:
    cfg = build_config(
        "quick",
        num_sites=20,
        repeats=repeats,
        static_sweep=(5, 10, 20),
        policies=("powertrip", "static-optimal", "select-all"),
    )
    summaries = [_summary(p, r, t) for p, ts in tta.items() for r, t in enumerate(ts)]
    sites = generate_sites(20, np.random.default_rng(0), cfg.distance_mode)
    return StudyResult(cfg, sites, 0.45, k_star=10, summaries=summaries)


ONE_REPEAT = {
    "static-5": [None],  # never reached: the valley's left wall
    "static-10": [1.0],
    "static-20": [2.0],
    "powertrip": [0.8],
    "static-optimal": [1.0],
    "select-all": [None],
}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_a_sweep_point_that_never_reached_the_target_is_drawn_as_missed():
    fig, ax = draw_static_sweep(_result(1, ONE_REPEAT))

    missed = [c for c in ax.collections if c.get_label() == "did not reach the target"]
    assert len(missed) == 1
    assert missed[0].get_offsets()[:, 0].tolist() == [5]
    (reached,) = [c for c in ax.containers if c.get_label() == "time to target"]
    assert reached.lines[0].get_xdata().tolist() == [10, 20]


def test_a_sweep_where_nothing_reached_the_target_still_shows_every_k():
    nothing = {**ONE_REPEAT, "static-10": [None], "static-20": [None]}
    fig, ax = draw_static_sweep(_result(1, nothing))

    (missed,) = [c for c in ax.collections if c.get_label() == "did not reach the target"]
    assert missed.get_offsets()[:, 0].tolist() == [5, 10, 20]


def test_one_repeat_draws_no_error_bars_and_says_so():
    fig, ax = draw_tta_bars(_result(1, ONE_REPEAT))

    assert not [c for c in ax.containers if c.__class__.__name__ == "ErrorbarContainer"]
    assert "one repeat, no error bars" in ax.get_title()
    assert "mean ± std" not in ax.get_title()


def test_repeats_draw_error_bars_over_the_repeats():
    three = {p: ts * 3 for p, ts in ONE_REPEAT.items()}
    three["powertrip"] = [0.6, 0.8, 1.0]
    fig, ax = draw_tta_bars(_result(3, three))

    assert [c for c in ax.containers if c.__class__.__name__ == "ErrorbarContainer"]
    assert "mean ± std" in ax.get_title()


def test_each_bar_carries_its_ratio_to_static_optimal_or_says_it_missed():
    fig, ax = draw_tta_bars(_result(1, ONE_REPEAT))

    labels = _texts(ax)  # in policy order: powertrip, static-optimal, select-all
    assert labels[0] == "0.80× static-opt."
    assert labels[1] == "1.00× static-opt."
    assert labels[2] == "did not reach\nthe target"


def test_write_plots_writes_both_study_figures(tmp_path):
    result = _result(1, ONE_REPEAT)
    result.runs = []  # no per-round traces: the time plots are drawn empty, not skipped

    made = write_plots(result, tmp_path)

    names = {p.name for p in made}
    assert {"tta_bars.png", "static_sweep.png"} <= names
    assert all(p.stat().st_size > 0 for p in made)
