"""The update codec in the emulator: config, the priced update size, per-site error feedback."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.codecs import get_codec
from powertrip.config.experiment import build_config
from powertrip.config.sites import RoundTimeModel
from powertrip.federation import build_federation, load_workload
from powertrip.rounds.emulate import Emulator, TimeModel, TrajectoryCache
from powertrip.selection.base import StaticTopK
from powertrip.sites.profiles import ModelledLinks, StaticPower, generate_sites
from powertrip.study.powertrip import check_registered_names, wire_update_bytes

TINY = {
    "num_sites": 8,
    "num_samples": 800,
    "static_sweep": (2, 4, 8),
    "max_rounds": 6,
    "policies": ("powertrip", "static-optimal"),
    "target_accuracy": 0.3,
    "ideal_compute_s": 10.0,
}


@pytest.fixture(scope="module")
def tiny_data():
    return load_workload(build_config(None, **TINY))


def _emulator(cfg, data, cache=None):
    sites = generate_sites(cfg.num_sites, np.random.default_rng(cfg.site_seed))
    fed = build_federation(cfg, data, 0)
    tm = TimeModel(cfg.ideal_compute_s, wire_update_bytes(cfg, fed.initial_params))
    tm = TimeModel(tm.ideal_compute_s, tm.update_bytes, RoundTimeModel.PER_SITE_MAX)
    em = Emulator(
        fed,
        sites,
        StaticPower(sites.base_power),
        ModelledLinks(sites),
        tm,
        0,
        cache,
        codec=cfg.codec,
        error_feedback=cfg.error_feedback,
    )
    return fed, em


def test_a_run_refuses_an_unknown_codec_and_dumps_leave_defaults_out():
    cfg = build_config(None, **TINY)
    assert cfg.codec == "none" and cfg.error_feedback is True
    dumped = cfg.model_dump()
    assert "codec" not in dumped and "error_feedback" not in dumped
    on = build_config(None, **TINY, codec="topk-10", error_feedback=False)
    assert on.model_dump()["codec"] == "topk-10" and on.model_dump()["error_feedback"] is False
    # the configuration holds the name; the codec registry refuses it before the run starts
    unknown = build_config(None, **TINY, codec="int3")
    with pytest.raises(ValueError, match="known: fp8, int4, int8, none, topk-<p>"):
        check_registered_names(unknown)


def test_none_leaves_the_update_bytes_unchanged(tiny_data):
    cfg = build_config(None, **TINY)
    fed, em = _emulator(cfg, tiny_data)
    assert wire_update_bytes(cfg, fed.initial_params) == cfg.update_bytes
    assert em.time.update_bytes == cfg.update_bytes and em.codec is None


@pytest.mark.parametrize("name", ["int8", "int4", "topk-10"])
def test_a_codec_shrinks_the_priced_update_by_its_exact_ratio(tiny_data, name):
    cfg = build_config(None, **TINY, codec=name)
    fed, em = _emulator(cfg, tiny_data)
    ratio = get_codec(name).ratio(tuple(t.shape) for t in fed.initial_params.values())
    assert 0 < ratio < 0.3
    assert em.time.update_bytes == pytest.approx(cfg.update_bytes * ratio)


def test_sites_updates_go_through_the_codec_with_their_own_residuals(tiny_data):
    plain_cfg = build_config(None, **TINY)
    cfg = build_config(None, **TINY, codec="topk-1")
    _, plain = _emulator(plain_cfg, tiny_data)
    cache = TrajectoryCache()
    _, em = _emulator(cfg, tiny_data, cache)
    a = plain.run(StaticTopK(4), None, 3)
    b = em.run(StaticTopK(4), None, 3)
    c = em.run(StaticTopK(4), None, 3)
    assert [r.accuracy for r in a.rounds] != [r.accuracy for r in b.rounds]
    # error feedback makes rounds depend on each site's history: nothing is shared
    assert cache.hits == 0 and len(cache._entries) == 0
    assert [r.accuracy for r in b.rounds] == [r.accuracy for r in c.rounds]
    # the same wire size per round (the time model), so the comm-bound rounds are faster
    assert sum(r.duration_s for r in b.rounds) < sum(r.duration_s for r in a.rounds)


def test_without_error_feedback_rounds_are_shared_through_the_cache(tiny_data):
    cfg = build_config(None, **TINY, codec="int8", error_feedback=False)
    cache = TrajectoryCache()
    _, em = _emulator(cfg, tiny_data, cache)
    first = em.run(StaticTopK(4), None, 3)
    again = em.run(StaticTopK(4), None, 3)
    assert cache.hits == 3 and first.rounds == again.rounds
