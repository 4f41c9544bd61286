"""How a curtailment study lays out its sites: regions from the trace, power fractions, and the
power a capped site draws."""

from __future__ import annotations

import pytest

from powertrip.config.curtailment import build_curtail_config
from powertrip.study.curtailment import build_sites, load_carbon


def test_default_sites_are_one_per_region_of_the_labelled_synthetic_trace():
    cfg = build_curtail_config("curtailment")
    trace = load_carbon(cfg)

    sites = build_sites(cfg, trace)

    assert trace.label == "synthetic-carbon"
    assert [s.region for s in sites] == list(trace.regions)
    assert all(s.power == 1.0 and s.train_kw == cfg.train_kw for s in sites)


def test_a_capped_site_trains_at_idle_plus_its_share_of_the_training_increment():
    cfg = build_curtail_config("curtailment", sites_per_region=2, site_power=(1, 0.5) * 3)

    sites = build_sites(cfg, load_carbon(cfg))

    assert [s.name for s in sites[:2]] == ["region-0-0", "region-0-1"]
    assert sites[1].train_kw == pytest.approx(0.468 + 0.5 * (2.024 - 0.468))
    assert sites[1].idle_kw == 0.468


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"regions": ("region-0", "elsewhere")}, "elsewhere not in the carbon trace"),
        ({"site_power": (1.0, 0.5)}, "2 value"),
    ],
)
def test_sites_the_trace_cannot_back_are_refused(overrides, message):
    cfg = build_curtail_config("curtailment", **overrides)

    with pytest.raises(ValueError, match=message):
        build_sites(cfg, load_carbon(cfg))


def test_config_refuses_unknown_policies_and_out_of_range_values():
    with pytest.raises(ValueError, match="unknown policy 'greedy'"):
        build_curtail_config("curtailment", policies=("greedy",))
    with pytest.raises(ValueError, match="site power"):
        build_curtail_config("curtailment", site_power=(1.5,))
    with pytest.raises(ValueError, match="unknown preset"):
        build_curtail_config("nope")
