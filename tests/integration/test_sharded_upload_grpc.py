"""A site's update as per-rank shard streams (reliability R31), over a real AggregatorService on a
real socket: the worker's ``GrpcUploader.send_shards`` (N concurrent streams, float32 or
bfloat16) folds to exactly the unsharded result, every malformed shard is refused naming site,
round and shard while the round commits the other sites, and a site missing a shard counts for
nothing."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from powertrip.aggregation.fedavg import StreamingFedAvg
from powertrip.services.common.bf16 import bf16_bits, widen_into
from powertrip.services.worker.sites_host import SiteUpdate
from powertrip.services.worker.uploader import GrpcUploader, shard_updates, update_messages
from tests.integration import test_aggregator_servicer as servicer_tests
from tests.integration.test_aggregator_servicer import C, code_of, register

# the servicer tests' real AggregatorRun and server, shared rather than built twice
run, stub = servicer_tests.run, servicer_tests.stub

ROUND = 3


def honest(run, site: int) -> float:
    return float(run.executor.site_weights[site])


def site_update(run, site: int, weight: float | None = None) -> SiteUpdate:
    rng = np.random.default_rng(site)
    delta = {
        k: (rng.standard_normal(v.shape) * 0.01).astype(np.float32)
        for k, v in run.executor.params.items()
    }
    return SiteUpdate(site, delta, honest(run, site) if weight is None else weight, 0.1)


def send(s, update: SiteUpdate, worker="w-a", shard=None, bf16=False):
    messages = update_messages(worker, ROUND, update, 4096, bf16, shard)
    return s.SubmitUpdate(messages, timeout=10)


def send_shard(s, update: SiteUpdate, index: int, count: int, **kw):
    return send(s, shard_updates(update, count)[index], shard=(index, count), **kw)


def widened(a: np.ndarray) -> np.ndarray:
    bits = bf16_bits(a)
    return widen_into(bits, np.empty(bits.shape, np.uint32)).copy()


def expected_model(run, sites, bf16_sites=()):
    """The unsharded FedAvg of the honest updates of ``sites``, in selection order."""
    ref = StreamingFedAvg(run.executor.params)
    for site in sites:
        u = site_update(run, site)
        delta = {k: widened(v) for k, v in u.delta.items()} if site in bf16_sites else u.delta
        ref.add(delta, u.num_samples)
    return ref.apply(run.executor.params)


def assert_model(run, collector, want) -> None:
    got = collector.agg.apply(run.executor.params)
    assert all(np.array_equal(got[k], want[k]) for k in want)


@pytest.fixture
def open_round(stub, run):
    s, channel = stub
    register(s, "w-a", ["site-000", "site-001"])
    register(s, "w-b", ["site-002"])
    collector = run.executor.open_round(ROUND, [0, 1, 2])
    yield s, channel, collector
    collector.close()
    run.executor.collector = None


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("count", [4, 8])
def test_concurrent_shard_streams_fold_to_the_unsharded_result(open_round, run, count, bf16):
    s, channel, collector = open_round
    uploader = GrpcUploader(channel, "w-a", 4096, bf16=bf16)
    uploader.send_shards(ROUND, shard_updates(site_update(run, 0), count), timeout_s=20)
    assert send(s, site_update(run, 1)).accepted
    assert send(s, site_update(run, 2), worker="w-b").accepted
    assert collector.wait(5)
    collector.close()
    assert collector.accepted == [0, 1, 2] and collector.failed == {}
    assert_model(run, collector, expected_model(run, [0, 1, 2], bf16_sites={0} if bf16 else ()))


def _bad_shapes(s, run):
    return code_of(lambda: send(s, site_update(run, 0), shard=(0, 4)))  # the whole, as shard 0


def _out_of_range(s, run):
    last = shard_updates(site_update(run, 0), 4)[3]
    return code_of(lambda: send(s, last, shard=(4, 4)))


def _too_many(s, run):
    return code_of(lambda: send(s, site_update(run, 0), shard=(0, 65)))


def _count_mismatch(s, run):
    assert send_shard(s, site_update(run, 0), 0, 4).accepted
    return code_of(lambda: send_shard(s, site_update(run, 0), 1, 2))


def _weight_mismatch(s, run):
    assert send_shard(s, site_update(run, 0), 0, 4).accepted
    lighter = site_update(run, 0, weight=honest(run, 0) - 1)
    return code_of(lambda: send_shard(s, lighter, 1, 4))


@pytest.mark.reliability("R31", "R11")
@pytest.mark.parametrize(
    ("attempt", "reason", "shard", "words"),
    [
        (_bad_shapes, "shape", "shard 0 of 4", "expected (6, 1, 5)"),
        (_out_of_range, "shard", "shard 4 of 4", "out of range"),
        (_too_many, "shard", "shard 0 of 65", "1 to 64 shards"),
        (_count_mismatch, "shard", "shard 1 of 2", "other shards say 4 shards"),
        (_weight_mismatch, "shard", "shard 1 of 4", "differs from the site's other shards'"),
    ],
)
def test_a_malformed_shard_is_refused_and_the_round_commits_the_other_sites(
    open_round, run, attempt, reason, shard, words
):
    s, _, collector = open_round
    got, details = attempt(s, run)
    assert got == C.INVALID_ARGUMENT and words in details, details
    assert f"site-000 for round {ROUND}, {shard}" in details, details
    assert send(s, site_update(run, 1)).accepted
    assert send(s, site_update(run, 2), worker="w-b").accepted
    assert collector.wait(5)  # the refused site failed: the round need not wait for it
    collector.close()
    assert collector.accepted == [1, 2] and collector.failed == {0: reason}
    assert_model(run, collector, expected_model(run, [1, 2]))


@pytest.mark.reliability("R31")
def test_a_duplicate_shard_is_refused_and_the_site_still_counts_once(open_round, run):
    s, _, collector = open_round
    assert send_shard(s, site_update(run, 0), 0, 4).accepted
    got, details = code_of(lambda: send_shard(s, site_update(run, 0), 0, 4))
    assert got == C.ALREADY_EXISTS and f"site-000 round {ROUND} shard 0 of 4" in details
    for i in (1, 2, 3):
        assert send_shard(s, site_update(run, 0), i, 4).accepted
    assert send(s, site_update(run, 1)).accepted
    assert send(s, site_update(run, 2), worker="w-b").accepted
    collector.close()
    assert collector.accepted == [0, 1, 2]
    assert_model(run, collector, expected_model(run, [0, 1, 2]))


@pytest.mark.reliability("R31")
def test_a_site_missing_a_shard_contributes_nothing(open_round, run):
    s, _, collector = open_round
    for i in (0, 1, 3):  # shard 2 of 4 never comes
        assert send_shard(s, site_update(run, 0), i, 4, bf16=True).accepted
    assert send(s, site_update(run, 1)).accepted
    assert send(s, site_update(run, 2), worker="w-b").accepted
    assert not collector.wait(0.2)
    collector.close()  # the deadline
    assert collector.accepted == [1, 2] and collector.failed == {0: "deadline"}
    assert_model(run, collector, expected_model(run, [1, 2]))
    got, _ = code_of(lambda: send_shard(s, site_update(run, 0), 2, 4))
    assert got == C.FAILED_PRECONDITION  # too late: the round is closed


def test_an_update_carrying_its_ranks_shards_goes_as_shard_streams(open_round, run):
    s, channel, collector = open_round
    whole = site_update(run, 0)
    ranks = replace(whole, delta={}, shards=[u.delta for u in shard_updates(whole, 3)])
    GrpcUploader(channel, "w-a", 4096)(ROUND, ranks, timeout_s=20)  # as a worker's runner calls
    assert send(s, site_update(run, 1)).accepted
    assert send(s, site_update(run, 2), worker="w-b").accepted
    collector.close()
    assert collector.accepted == [0, 1, 2]
    assert_model(run, collector, expected_model(run, [0, 1, 2]))
