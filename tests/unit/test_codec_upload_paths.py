"""The run's codec on every upload path, its error feedback written once (``codecs.compress``)
and each site's residual kept in its host's ``SiteStateBook``: per-rank shards, each coded on
its own with its rows of the site's one residual, and a curtailment worker's sub-round updates
decode (as the aggregator decodes them) to what the whole-update path sends, within the codec's
error; and a worker's residuals survive its restart and a redone round."""

from __future__ import annotations

import numpy as np
import pytest

from powertrip.codecs import ErrorFeedback, get_codec
from powertrip.config.curtailment import build_curtail_config
from powertrip.config.experiment import build_config
from powertrip.federation import StreamSetup
from powertrip.learning.state_book import round_key
from powertrip.services.common.tensor_stream import shard_specs, specs_of
from powertrip.services.common.update_codec import decode_update
from powertrip.services.worker.sites_host import SitesHost
from powertrip.services.worker.state_dir import SavedRun, WorkerStateDir
from powertrip.services.worker.stream_host import StreamHost

SHAPES = {"conv.weight": (8, 1, 5), "fc.weight": (10, 300), "fc.bias": (10,), "gain": ()}
SPECS = specs_of({n: np.zeros(s, np.float32) for n, s in SHAPES.items()})


def drifting(rng: np.random.Generator, mean: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One round's delta: a steady direction plus noise (what error feedback must not lose)."""
    return {n: (m + 0.5 * rng.standard_normal(m.shape)).astype(np.float32) for n, m in mean.items()}


def stitched(codec: str, parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The shards' payloads decoded as the aggregator decodes them, put back together."""
    count, out = len(parts), {}
    shards = [
        decode_update(shard_specs(SPECS, count, i), get_codec(codec), p)
        for i, p in enumerate(parts)
    ]
    for s in SPECS:
        got = [d[s.name] for d in shards if s.name in d]
        out[s.name] = got[0] if not s.shape else np.concatenate(got)
    return out


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("codec", ["none", "int8", "topk-10"])
def test_per_rank_shards_coded_on_their_own_send_what_the_whole_update_sends(codec, count):
    rng = np.random.default_rng(3)
    mean = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    sharded, whole = ErrorFeedback(get_codec(codec)), ErrorFeedback(get_codec(codec))
    true = {n: np.zeros(s) for n, s in SHAPES.items()}
    sent = {n: np.zeros(s) for n, s in SHAPES.items()}
    sent_whole = {n: np.zeros(s) for n, s in SHAPES.items()}
    for r in range(1, 101):
        delta = drifting(rng, mean)
        before = sharded.residuals.get(0, {})
        got = stitched(codec, sharded.encode_shards(0, delta, count, round_key(r)))
        want = whole.apply(0, delta, round_key(r))
        after = sharded.residuals[0]
        for n in SHAPES:  # what a shard did not send is exactly what the site carries on
            np.testing.assert_allclose(
                got[n] + after[n], delta[n] + before.get(n, 0.0), rtol=0, atol=1e-5
            )
            if codec == "none":
                assert np.array_equal(got[n], delta[n]) and np.array_equal(want[n], delta[n])
            true[n] += delta[n]
            sent[n] += got[n]
            sent_whole[n] += want[n]
    for n in SHAPES:
        scale = np.linalg.norm(true[n])
        assert np.linalg.norm(sent[n] - true[n]) < 0.06 * scale  # the residual stays bounded
        assert np.linalg.norm(sent[n] - sent_whole[n]) < 0.06 * scale  # as the whole path's


CURTAIL = build_curtail_config("curtailment-quick", num_samples=1000, codec="int8")
ROWS = {0: np.arange(100, 170), 1: np.arange(0, 64)}


def test_a_curtailment_workers_coded_updates_decode_to_the_emulators_learners():
    """Three sub-rounds over two elastic rounds (the second one site's chunk alone): what the
    worker sends decodes, bit for bit, to what ``powertrip curtail``'s learner folds, and that
    is the uncoded update within int8's error."""
    host = StreamHost(CURTAIL, [0, 1])
    coded = StreamSetup.load(CURTAIL).learner()
    raw = StreamSetup.load(CURTAIL.model_copy(update={"codec": "none"})).learner()
    params = {k: v.numpy() for k, v in host.setup.params.items()}
    specs = specs_of(params)
    plan = [(1, 1, [0, 1]), (1, 2, [0]), (2, 3, [0, 1])]  # (elastic round, sub-round, sites)
    started = 0
    for elastic, sub, sites in plan:
        if elastic != started:  # a new elastic round
            coded.start_round()
            raw.start_round()
            started = elastic
        rows = {s: ROWS[s] for s in sites}
        updates = host.train_rows(params, rows, round_index=sub, stream_round=elastic)
        want = coded.train_sites(coded.params, sites, list(rows.values()))
        plain = raw.train_sites(raw.params, sites, list(rows.values()))
        for u, w, p in zip(updates, want, plain, strict=True):
            assert u.codec == "int8" and all("#" in name for name in u.delta)
            got = decode_update(specs, get_codec("int8"), u.delta)
            for name, t in w.items():
                assert np.array_equal(got[name], t.numpy()), name
                bound = float(np.abs(p[name].numpy()).max()) / 127 + 1e-9
                assert np.abs(got[name] - p[name].numpy()).max() <= 2 * bound, name


def coded_host(state: WorkerStateDir | None, codec: str = "topk-10") -> SitesHost:
    cfg = build_config("quick", num_sites=4, num_samples=1000, codec=codec)
    store = None if state is None else state.store(SavedRun(cfg.model_dump_json(), 0))
    return SitesHost(cfg, run_seed=0, sites=[0, 1], store=store)


def same(a, b) -> bool:
    return sorted(a.delta) == sorted(b.delta) and all(
        np.array_equal(a.delta[k], b.delta[k]) for k in a.delta
    )


def test_a_restarted_worker_resumes_its_sites_residuals_bit_identically(tmp_path):
    """Plain SGD keeps no optimizer state, but top-k's residual is what the site has not sent
    yet: it is saved after every round and a restarted worker sends what an uninterrupted one
    sends (without its residual it would send something else)."""
    state = WorkerStateDir(tmp_path)
    before = coded_host(state)
    params = before.template
    before.train(params, 1, [0, 1])
    after = coded_host(state)  # the restart: a new host from the same directory
    resumed = after.train(params, 2, [1])[0]
    uninterrupted = before.train(params, 2, [1])[0]
    assert resumed.codec == "topk-10" and same(resumed, uninterrupted)
    forgetful = coded_host(None)  # a restart without the residual
    assert not same(forgetful.train(params, 2, [1])[0], uninterrupted)


def test_a_redone_round_adds_the_residual_from_before_it():
    worker = coded_host(None)
    params = worker.template
    worker.train(params, 1, [0])
    first = worker.train(params, 2, [0])[0]
    again = worker.train(params, 2, [0])[0]  # the aggregator resumed from before round 2
    assert same(again, first)
