"""The trained model leaves a running aggregator: ``powertrip model pull`` (mutual TLS, as the
operator) writes the aggregator's current model as a model file; loaded into a fresh model and
scored on the aggregator's evaluation set by the aggregator's own evaluation code, it scores what
the aggregator reported for its round. The aggregator also leaves it in its checkpoint directory
when the run ends, and refuses it to a worker's certificate."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from click.testing import CliRunner

from powertrip.federation import build_federation, load_workload
from powertrip.learning.model_file import load_model, read_model, read_model_card
from powertrip.learning.site_params import get_params
from powertrip.services.cli.certs import tls_env
from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.services.cli.model import model as model_command
from powertrip.services.common.config import ServiceConfig, load_config
from powertrip.services.common.grpc_client import make_channel
from powertrip.services.common.identity import AGGREGATOR
from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A small mTLS cluster that trained a few rounds and stays up after its run is done."""
    out = tmp_path_factory.mktemp("pull")
    plan = ClusterPlan(
        workers=2,
        sites=4,
        policy="select-all",
        target=0.99,  # unreachable: every round of the budget runs
        max_rounds=3,
        num_samples=1000,
        log_dir=out / "logs",
        checkpoint_dir=out / "checkpoints",
        tls_dir=out / "tls",
        device="cpu",  # where the test scores the pulled model: the same arithmetic
    )
    with LocalCluster(plan) as cluster:
        cluster.start()
        status = cluster.wait_done(300)
        yield cluster, status, out


def test_a_pulled_model_scores_what_the_aggregator_reported_for_its_round(finished):
    cluster, status, out = finished
    assert status.state == aggregator_pb2.RUN_STATE_DONE

    pulled = CliRunner().invoke(
        model_command,
        [
            "pull",
            "--aggregator",
            cluster.aggregator.grpc_addr,
            "--tls-dir",
            str(out / "tls"),
            "--output",
            str(out / "pulled.safetensors"),
        ],
    )

    assert pulled.exit_code == 0, pulled.output
    card = read_model_card(out / "pulled.safetensors")
    reported = {r.round: r for r in status.rounds}
    assert card.round == status.round == 3 and card.source == "aggregator"
    assert card.accuracy == reported[card.round].accuracy
    # a fresh model holding the pulled weights, scored as the aggregator scores a round
    model = load_model(out / "pulled.safetensors")
    cfg = card.settings()
    fed = build_federation(cfg, load_workload(cfg, seed=cfg.seed), cfg.seed, "cpu")
    accuracy, loss = fed.trainer.evaluate(get_params(model), fed.x_test, fed.y_test)
    said = reported[card.round]
    print(
        f"round {card.round}: the aggregator reported accuracy {said.accuracy!r} loss "
        f"{said.loss!r}; the pulled model scores accuracy {accuracy!r} loss {loss!r}"
    )
    assert accuracy == reported[card.round].accuracy
    assert loss == pytest.approx(reported[card.round].loss, rel=1e-6)


def test_the_run_leaves_its_final_model_in_the_checkpoint_directory(finished):
    cluster, status, out = finished
    final, card = read_model(out / "checkpoints" / "model.safetensors")

    assert card.round == status.round
    pulled, _ = read_model(out / "pulled.safetensors")  # the run is over: the same weights
    assert final.keys() == pulled.keys()
    assert all(np.array_equal(final[k], pulled[k]) for k in final)


def test_a_workers_certificate_may_not_pull_the_model(finished):
    cluster, _, out = finished
    cfg = load_config(ServiceConfig, tls_env(out / "tls", "worker-0"))
    with make_channel(cluster.aggregator.grpc_addr, cfg, AGGREGATOR) as channel:
        stub = aggregator_pb2_grpc.AggregatorServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            next(stub.GetModel(aggregator_pb2.GetModelRequest(), timeout=30))

    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "may not call AggregatorService.GetModel" in refused.value.details()


def test_pull_needs_tls_or_an_explicit_insecure(tmp_path):
    refused = CliRunner().invoke(
        model_command,
        ["pull", "--aggregator", "127.0.0.1:1", "--output", str(tmp_path / "m")],
    )

    assert refused.exit_code == 2
    assert "give --tls-dir DIR" in refused.output
