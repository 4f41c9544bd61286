"""A curtailment-mode worker trains exactly the data-stream rows the round names, in order, as
the emulator's StreamLearner does, and weights each update by its optimizer steps."""

from __future__ import annotations

import queue

import grpc
import numpy as np
import pytest
import torch

from powertrip.config.curtailment import build_curtail_config
from powertrip.federation import StreamSetup
from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.grpc_server import build_server
from powertrip.services.common.tensor_stream import encode, wrap_tensor_stream
from powertrip.services.worker.runner import RoundRunner
from powertrip.services.worker.servicer import WorkerServicer
from powertrip.services.worker.site_host import RoundJob
from powertrip.services.worker.state_dir import SavedRun, WorkerStateDir
from powertrip.services.worker.stream_host import StreamHost
from powertrip.sites.profiles import site_id
from powertrip.v1 import common_pb2, worker_pb2, worker_pb2_grpc

HOSTED = [0, 1]
CFG = build_curtail_config("curtailment-quick", num_samples=1000)


@pytest.fixture(scope="module")
def host():
    return StreamHost(CFG, HOSTED)


@pytest.fixture
def worker(host):
    uploads: queue.Queue = queue.Queue()
    runner = RoundRunner(lambda r, update, timeout: uploads.put((r, update)))
    runner.start(host)
    servicer = WorkerServicer(runner, HOSTED)
    server, port, _ = build_server(
        [lambda s: worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, s)],
        "127.0.0.1:0",
        ServiceConfig(insecure=True),
    )
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield worker_pb2_grpc.WorkerServiceStub(ch), uploads
    runner.stop()
    server.stop(grace=None)


def stream_round(params, rows: dict[str, np.ndarray]):
    spec = common_pb2.RoundSpec(
        round=1,
        site_ids=list(rows),
        deadline_seconds=30,
        stream_rows={s: common_pb2.StreamRows(positions=r.tolist()) for s, r in rows.items()},
    )
    yield worker_pb2.StartRoundRequest(spec=spec)
    yield from wrap_tensor_stream(encode(params, 4096), worker_pb2.StartRoundRequest)


def test_a_stream_round_trains_the_named_rows_like_the_emulators_learner(worker, host):
    stub, uploads = worker
    params = {k: v.numpy() for k, v in host.setup.params.items()}
    rows = {"site-000": np.arange(100, 170), "site-001": np.arange(0, 32)}
    stub.StartRound(stream_round(params, rows), timeout=10)
    got = {u.site: u for _, u in (uploads.get(timeout=30), uploads.get(timeout=30))}

    reference = StreamSetup.load(CFG).learner()
    torch_params = {k: torch.from_numpy(v) for k, v in params.items()}
    expected = reference.train_sites(torch_params, HOSTED, [rows["site-000"], rows["site-001"]])
    assert [got[0].num_samples, got[1].num_samples] == [3.0, 1.0]  # ceil(70 / 32), 32 / 32
    for site, delta in zip(HOSTED, expected, strict=True):
        for k, v in delta.items():
            np.testing.assert_array_equal(got[site].delta[k], v.numpy())


@pytest.mark.parametrize(
    ("spec_sites", "rows", "words"),
    [
        (["site-000", "site-001"], {"site-000": np.arange(5)}, "exactly the round's sites"),
        (["site-000"], {"site-000": np.arange(0)}, "at least one row"),
    ],
)
def test_stream_rows_must_cover_exactly_the_rounds_sites(worker, host, spec_sites, rows, words):
    stub, _ = worker
    params = {k: v.numpy() for k, v in host.setup.params.items()}
    spec = common_pb2.RoundSpec(
        round=1,
        site_ids=spec_sites,
        deadline_seconds=30,
        stream_rows={s: common_pb2.StreamRows(positions=r.tolist()) for s, r in rows.items()},
    )
    stream = [worker_pb2.StartRoundRequest(spec=spec)]
    stream += list(wrap_tensor_stream(encode(params, 4096), worker_pb2.StartRoundRequest))
    with pytest.raises(grpc.RpcError) as err:
        stub.StartRound(iter(stream), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in err.value.details()


def test_a_partition_round_is_refused_by_a_stream_worker(worker, host):
    stub, _ = worker
    params = {k: v.numpy() for k, v in host.setup.params.items()}
    spec = common_pb2.RoundSpec(round=1, site_ids=["site-000"], deadline_seconds=30)
    stream = [worker_pb2.StartRoundRequest(spec=spec)]
    stream += list(wrap_tensor_stream(encode(params, 4096), worker_pb2.StartRoundRequest))
    with pytest.raises(grpc.RpcError) as err:
        stub.StartRound(iter(stream), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_stream_site_resumes_its_kept_adamw_moments_as_the_emulators_learner_does():
    """Two sub-rounds on one worker give what the StreamLearner gives over the same two calls."""
    recipe = {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1}
    cfg = build_curtail_config("curtailment-quick", num_samples=1000, local_optimizer=recipe)
    host = StreamHost(cfg, HOSTED)
    reference = StreamSetup.load(cfg).learner()
    params = {k: v.numpy() for k, v in host.setup.params.items()}
    torch_params = {k: torch.from_numpy(v) for k, v in params.items()}
    subrounds = [{0: np.arange(0, 64), 1: np.arange(64, 96)}, {0: np.arange(96, 160)}]
    for sub_round, rows in enumerate(subrounds, start=1):
        got = host.train_rows(params, rows, sub_round)
        want = reference.train_sites(torch_params, list(rows), list(rows.values()))
        for update, delta in zip(got, want, strict=True):
            for k, v in delta.items():
                np.testing.assert_allclose(update.delta[k], v.numpy(), rtol=1e-5, atol=1e-7)
    assert host.site_states is not None and host.site_states[0].step == 4  # 2 + 2 steps


def spec_and_job(host: StreamHost, params, sub_round: int, stream_round: int, rows) -> RoundJob:
    """A sub-round as the aggregator sends it (``RoundSpec.stream_round`` names its elastic
    round), read by the host as the servicer does."""
    spec = common_pb2.RoundSpec(
        round=sub_round,
        stream_round=stream_round,
        site_ids=[site_id(s) for s in rows],
        deadline_seconds=30,
        stream_rows={
            site_id(s): common_pb2.StreamRows(positions=r.tolist()) for s, r in rows.items()
        },
    )
    got = host.round_inputs(spec)
    return RoundJob(sub_round, list(rows), params, 30.0, stream_rows=got)


@pytest.mark.reliability("R37")
def test_a_reset_recipe_resets_per_round_not_per_sub_round_and_a_restart_resumes_from_disk(
    tmp_path,
):
    """keep_state=False with a warm-up: the StreamLearner carries a site's moments across a
    lone site's chunks (sub-rounds of one round) and its step count (the warm-up's position)
    across rounds. A worker does the same from the round each spec names, and a worker
    restarted between the rounds resumes its sites' states from its state directory."""
    recipe = {"name": "adamw", "lr": 1e-3, "warmup_steps": 6, "keep_state": False}
    cfg = build_curtail_config("curtailment-quick", num_samples=1000, local_optimizer=recipe)
    store = WorkerStateDir(tmp_path).store(SavedRun(cfg.model_dump_json(), cfg.seed))
    reference = StreamSetup.load(cfg).learner()
    # (elastic round, {site: rows}) per sub-round: round 1 is site 1's batch, then site 0 alone
    # in two chunks; round 2 trains both
    plan = [
        (1, {1: np.arange(0, 64)}),
        (1, {0: np.arange(64, 128)}),
        (1, {0: np.arange(128, 192)}),
        (2, {0: np.arange(192, 256), 1: np.arange(256, 288)}),
    ]
    host = StreamHost(cfg, HOSTED, store=store)
    params = {k: v.numpy() for k, v in host.setup.params.items()}
    torch_params = {k: torch.from_numpy(v) for k, v in params.items()}
    started = 0
    for sub_round, (stream_round, rows) in enumerate(plan, start=1):
        if stream_round != started:
            reference.start_round()
            started = stream_round
        if stream_round == 2 and host.site_states:  # the worker restarted between the rounds
            host = StreamHost(cfg, HOSTED, store=store)
        got = host.run_round(spec_and_job(host, params, sub_round, stream_round, rows))
        want = reference.train_sites(torch_params, list(rows), list(rows.values()))
        for update, delta in zip(got, want, strict=True):
            for k, v in delta.items():
                np.testing.assert_allclose(update.delta[k], v.numpy(), rtol=1e-5, atol=1e-7)
    assert host.site_states is not None
    assert {s: st.step for s, st in host.site_states.items()} == {0: 6, 1: 3}
    assert reference.site_states is not None
    assert {s: st.step for s, st in reference.site_states.items()} == {0: 6, 1: 3}
