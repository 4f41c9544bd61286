"""A worker whose one site is a GPU cluster trains the same run as the in-process host: same
partition, same batch order, same recipe. Its two gloo ranks give the in-process update within
float rounding, its update leaves as one shard per rank, and the run mode picks it from the
worker's settings alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from powertrip.config.experiment import build_config
from powertrip.config.recipe import LocalOptimizer
from powertrip.config.site_engine import SiteEngineConfig
from powertrip.learning.shards import shard_rows
from powertrip.services.common.config import load_config
from powertrip.services.worker.config import WorkerConfig
from powertrip.services.worker.distributed_host import DistributedSitesHost
from powertrip.services.worker.run_mode import UnsupportedMode, host_for_reply
from powertrip.services.worker.site_host import RoundJob
from powertrip.services.worker.sites_host import SitesHost
from powertrip.services.worker.state_dir import SiteStateStore
from powertrip.v1 import common_pb2

CFG = build_config(
    "quick",
    workload="lm",
    n_layer=1,
    d_model=32,
    n_head=2,
    context_length=16,
    partition="iid",
    num_sites=3,
    num_samples=240,
    max_local_steps=3,
    batch_size=8,
    local_optimizer=LocalOptimizer(name="adamw", weight_decay=0.1, clip_norm=1.0),
)
SITE = 1


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> SiteStateStore:
    return SiteStateStore(tmp_path_factory.mktemp("state") / "site-states.json", "run-5")


@pytest.fixture(scope="module")
def distributed(store):
    host = DistributedSitesHost(
        CFG, run_seed=5, sites=[SITE], device="cpu", engine=SiteEngineConfig(ranks=2), store=store
    )
    yield host
    host.close()


def test_two_ranks_train_the_in_process_hosts_update(distributed):
    local = SitesHost(CFG, run_seed=5, sites=[SITE], device="cpu")
    params = local.template
    job = RoundJob(round=2, sites=[SITE], params=params, deadline_s=120.0)

    (want,) = local.run_round(job)
    (got,) = distributed.run_round(job)

    assert got.site == SITE and got.num_samples == want.num_samples
    # AdamW divides by sqrt(v): float rounding (SDPA vs matmul attention, two ranks' gradient
    # sum) shows up to ~1e-5 on steps of lr 2e-3; a wrong batch or recipe differs by ~lr
    for name, d in want.delta.items():
        np.testing.assert_allclose(got.delta[name], d, rtol=1e-3, atol=2e-5, err_msg=name)
    assert np.abs(want.delta["tok.weight"]).max() > 1e-4  # it trained


def test_the_update_leaves_as_one_shard_per_rank(distributed):
    job = RoundJob(round=3, sites=[SITE], params=distributed.template, deadline_s=120.0)
    (update,) = distributed.run_round(job)

    assert update.shards is not None and len(update.shards) == 2
    for name, whole in update.delta.items():
        if whole.ndim == 0:
            continue
        for i, shard in enumerate(update.shards):
            lo, hi = shard_rows(whole.shape[0], 2, i)
            np.testing.assert_array_equal(shard[name], whole[lo:hi])


def test_stream_rows_are_not_for_a_distributed_site(distributed):
    spec = common_pb2.RoundSpec(round=1, site_ids=["site-001"])
    spec.stream_rows["site-001"].positions.append(0)
    with pytest.raises(ValueError, match="curtailment-mode"):
        distributed.round_inputs(spec)


class Reply:  # the fields of a RegisterWorkerResponse a host is built from
    def __init__(self, mode: str) -> None:
        self.mode, self.run_config_json, self.run_seed = mode, CFG.model_dump_json(), 5
        self.curtail_config_json = "{}"


def test_a_curtailment_run_refuses_site_ranks_before_loading_anything():
    cfg = load_config(
        WorkerConfig,
        {
            "POWERTRIP_AGGREGATOR_ADDR": "agg:1",
            "POWERTRIP_SITES": "site-001",
            "POWERTRIP_SITE_RANKS": "2",
            "POWERTRIP_INSECURE": "1",
        },
    )
    with pytest.raises(UnsupportedMode, match="POWERTRIP_SITE_RANKS"):
        host_for_reply(Reply("curtailment"), cfg, "cpu", None)


def test_a_restarted_worker_resumes_the_sites_saved_optimizer_state(distributed, store):
    """Saved after every round (the in-process host's file), resumed by the next process: its
    round is the one the first host trains next."""
    job = RoundJob(round=4, sites=[SITE], params=distributed.template, deadline_s=120.0)
    distributed.run_round(job)
    saved = distributed.group.site_state
    local = SitesHost(CFG, run_seed=5, sites=[SITE], device="cpu", store=store)
    (loaded,) = local.site_states.values()  # the in-process host reads the same file
    assert loaded.step == saved.step > 0 and set(loaded.moments) == set(saved.moments)

    engine = SiteEngineConfig(ranks=1)
    again = DistributedSitesHost(CFG, 5, [SITE], device="cpu", engine=engine, store=store)
    try:
        nxt = RoundJob(round=5, sites=[SITE], params=distributed.template, deadline_s=120.0)
        (want,) = distributed.run_round(nxt)
        (got,) = again.run_round(nxt)
    finally:
        again.close()
    for name, d in want.delta.items():
        np.testing.assert_allclose(got.delta[name], d, rtol=1e-3, atol=2e-5, err_msg=name)


def test_a_state_trained_to_nan_is_neither_kept_nor_saved(distributed, store, caplog):
    """NaN parameters give NaN moments: the ranks start the next round with fresh moments at
    the same schedule position, and the saved file never holds a NaN."""
    poisoned = {k: np.full_like(v, np.nan) for k, v in distributed.template.items()}
    with caplog.at_level("WARNING"):
        distributed.run_round(RoundJob(round=6, sites=[SITE], params=poisoned, deadline_s=120.0))
    assert "site-001: its optimizer state after round 6 is not kept nor saved (non-finite" in (
        caplog.text
    )
    kept = distributed.group.site_state
    assert kept.step > 0 and all(not t.any() for m in kept.moments.values() for t in m.values())
    saved = torch.load(store.path, weights_only=True)["states"][SITE]
    assert saved["step"] == kept.step and finite(saved["moments"])
    job = RoundJob(round=7, sites=[SITE], params=distributed.template, deadline_s=120.0)
    (update,) = distributed.run_round(job)
    assert all(np.isfinite(v).all() for v in update.delta.values())


def finite(moments: dict[str, dict[str, torch.Tensor]]) -> bool:
    return all(bool(torch.isfinite(t).all()) for m in moments.values() for t in m.values())
