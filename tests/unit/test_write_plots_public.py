"""``powertrip.write_plots`` is the public way to draw a study's figures: from a real (small)
study result it writes the four PNGs the CLI writes, and no static-sweep figure without a sweep."""

from __future__ import annotations

import pytest

import powertrip as pt

SMALL = {
    "num_sites": 6,
    "num_samples": 600,
    "max_rounds": 3,
    "target_accuracy": 0.99,
    "ideal_compute_s": 10.0,
}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def study():
    cfg = pt.build_config(
        None, **SMALL, static_sweep=(3, 6), policies=("powertrip", "static-optimal")
    )
    return pt.run_study(cfg)


def test_write_plots_is_exported_and_documented():
    assert "write_plots" in pt.__all__
    assert "out_dir" in pt.write_plots.__doc__ and "tta_bars.png" in pt.write_plots.__doc__


def test_a_study_result_gives_the_four_figures_in_a_new_folder(study, tmp_path):
    out = tmp_path / "figures" / "nested"  # created on demand

    made = pt.write_plots(study, str(out))  # a str path is accepted too

    assert [p.name for p in made] == [
        "tta_bars.png",
        "static_sweep.png",
        "sites_over_time.png",
        "accuracy_over_time.png",
    ]
    assert all(p.parent == out and p.read_bytes()[:8] == PNG for p in made)


def test_without_a_static_sweep_there_is_no_sweep_figure(tmp_path):
    cfg = pt.build_config(None, **SMALL, static_sweep=(), policies=("select-all",))

    made = pt.write_plots(pt.run_study(cfg), tmp_path)

    assert [p.name for p in made] == [
        "tta_bars.png",
        "sites_over_time.png",
        "accuracy_over_time.png",
    ]
    assert not (tmp_path / "static_sweep.png").exists()
