"""Link profiles for tc-scripts/ come from the site model: rate = B(d), delay = d/c one way."""

from __future__ import annotations

from pathlib import Path

import pytest

from powertrip.services.netem.topology_profile import format_tsv, link_profiles, main

PROFILES = Path(__file__).resolve().parents[2] / "tc-scripts" / "profiles"
# Great-circle miles from the hub (us-central) to each site; tc-scripts/README.md has the places.
SITE_DISTANCES_MI = {"us-east": 980, "eu-west": 4000, "ap-south": 8200}


def test_rate_and_delay_follow_the_distance_model_worked_by_hand():
    # B(1000 mi) = 10 Gbit/s / sqrt(2); d/c = 1000 * 1609.344 m / 2e8 m/s = 8.04672 ms
    (link,) = link_profiles([1000.0])
    assert link.rate == "7071.068mbit"
    assert link.delay == "8.047ms"


def test_rate_scale_shrinks_every_rate_and_leaves_delays_alone():
    full, scaled = link_profiles([500.0, 5000.0]), link_profiles([500.0, 5000.0], rate_scale=0.01)
    for f, s in zip(full, scaled, strict=True):
        assert s.rate_bps == pytest.approx(f.rate_bps * 0.01)
        assert s.delay == f.delay


def test_ten_gigabit_is_written_without_an_exponent():
    assert link_profiles([0.0])[0].rate == "10000mbit"


@pytest.mark.parametrize("scale", [0.0, -1.0, 1.5])
def test_rate_scale_outside_zero_one_is_refused(scale):
    with pytest.raises(ValueError, match="rate scale"):
        link_profiles([100.0], rate_scale=scale)


def test_tsv_has_one_row_per_site_under_a_comment_header():
    text = format_tsv(link_profiles([100.0, 200.0], names=["a", "b"]))
    lines = text.splitlines()
    assert lines[0].startswith("#")
    assert [line.split("\t")[0] for line in lines[1:]] == ["a", "b"]


@pytest.mark.parametrize("site", sorted(SITE_DISTANCES_MI))
def test_checked_in_site_profiles_are_what_the_generator_prints(site, capsys):
    argv = ["--distance-mi", str(SITE_DISTANCES_MI[site]), "--names", site, "--format", "env"]
    assert main(argv) == 0
    assert (PROFILES / f"{site}.env").read_text() == capsys.readouterr().out
