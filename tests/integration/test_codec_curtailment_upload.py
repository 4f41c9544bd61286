"""Update codecs on curtailment mode's wire: a real curtailment-mode AggregatorService on a real
socket, whose run assigns int8 (``POWERTRIP_CODEC``, in the curtailment run's configuration the
workers are given), and a curtailment worker's host coding each sub-round's update with its
sites' residuals. The sub-round's intake (``DeltaInbox``, as ``GrpcLearner`` opens it) holds
exactly the deltas ``powertrip curtail``'s learner folds; an uncoded update is refused naming
the site and the field."""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest

from powertrip.federation import StreamSetup
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.curtail_run import CurtailmentRun
from powertrip.services.aggregator.delta_inbox import DeltaInbox
from powertrip.services.common.config import load_config
from powertrip.services.worker.stream_host import StreamHost
from powertrip.services.worker.uploader import GrpcUploader, update_messages
from powertrip.v1 import aggregator_pb2_grpc
from tests.aggregator_in_process import serve
from tests.integration.test_aggregator_servicer import C, code_of, register

ENV = {
    "POWERTRIP_PROFILER_ADDR": "127.0.0.1:1",  # nothing there: no availability is asked for
    "POWERTRIP_MODE": "curtailment",
    "POWERTRIP_INSECURE": "1",
    "POWERTRIP_CURTAIL_PRESET": "curtailment-quick",
    "POWERTRIP_NUM_SITES": "3",
    "POWERTRIP_CODEC": "int8",
}
ROWS = {0: np.arange(100, 170), 1: np.arange(0, 64)}


@pytest.fixture(scope="module")
def served():
    run = CurtailmentRun(load_config(AggregatorConfig, ENV))
    server, port = serve(run)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield run, channel
    channel.close()
    server.stop(grace=None)
    run.stop()


def sub_round(run, n: int, params: dict[str, np.ndarray]) -> DeltaInbox:
    """Sub-round ``n`` opened as ``GrpcLearner.train_sites`` opens it."""
    given = {s: math.ceil(len(r) / run.config.batch_size) for s, r in ROWS.items()}
    inbox = DeltaInbox(n, list(ROWS), given)
    run.executor.params, run.executor.collector = params, inbox
    return inbox


def test_a_curtailment_workers_coded_sub_rounds_reach_the_learner_as_the_emulator_decodes_them(
    served,
):
    run, channel = served
    assert run.config.codec == "int8"
    register(aggregator_pb2_grpc.AggregatorServiceStub(channel), "w-a", ["site-000", "site-001"])
    host = StreamHost(run.config, [0, 1])  # the worker, built from the run's configuration
    learner = StreamSetup.load(run.config).learner()  # powertrip curtail's, same codec
    params = {k: v.numpy() for k, v in host.setup.params.items()}
    uploader = GrpcUploader(channel, "w-a", 4096)
    for n in (1, 2):  # two elastic rounds: the second adds each site's residual
        learner.start_round()
        inbox = sub_round(run, n, params)
        for update in host.train_rows(params, ROWS, round_index=n, stream_round=n):
            assert update.codec == "int8"
            uploader(n, update, timeout_s=20)
        assert inbox.wait(10)
        inbox.close()
        want = learner.train_sites(learner.params, list(ROWS), list(ROWS.values()))
        assert sorted(inbox.deltas) == [0, 1] and inbox.failed == {}
        for site, delta in zip(ROWS, want, strict=True):
            for name, t in delta.items():
                assert np.array_equal(inbox.deltas[site][name], t.numpy()), (n, site, name)
    run.executor.collector = None


def test_an_uncoded_curtailment_update_is_refused_naming_the_site_and_the_field(served):
    run, channel = served
    stub = aggregator_pb2_grpc.AggregatorServiceStub(channel)
    register(stub, "w-a", ["site-000", "site-001"])
    host = StreamHost(run.config.model_copy(update={"codec": "none"}), [0])
    params = {k: v.numpy() for k, v in host.setup.params.items()}
    inbox = sub_round(run, 3, params)
    (raw,) = host.train_rows(params, {0: ROWS[0]}, round_index=3)
    assert raw.codec == ""  # the raw floats
    messages = update_messages("w-a", 3, raw, 4096)
    code, details = code_of(lambda: stub.SubmitUpdate(messages, timeout=10))
    assert code == C.INVALID_ARGUMENT
    assert all(w in details for w in ("site-000", "codec", "'none'", "'int8'")), details
    assert inbox.deltas == {} and sorted(inbox.failed) == [0]
    inbox.close()
    run.executor.collector = None
