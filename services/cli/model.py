"""``powertrip model``: the trained model of a running aggregator, as a model file.

``powertrip model pull`` calls the aggregator's ``GetModel`` as the ``operator`` identity (mutual
TLS with the certificates ``powertrip certs`` or ``powertrip up`` minted) and writes what it
streams, the current model and its card, as the same ``NAME.safetensors`` + ``NAME.json`` pair
``powertrip experiment`` writes; ``powertrip.load_model`` reads it back
(``powertrip/learning/model_file.py``). Heavy imports (grpc, the stubs) happen in the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from powertrip.services.cli.common import fail, out

if TYPE_CHECKING:
    import grpc
    from numpy.typing import NDArray

    from powertrip.learning.model_file import ModelCard

__all__ = ["model", "pull_model"]

GIB = 1 << 30


@click.group()
def model() -> None:
    """The trained model: pull it from a running aggregator."""


@model.command()
@click.option(
    "--aggregator",
    "address",
    required=True,
    metavar="HOST:PORT",
    help="The aggregator's gRPC address (its READY line, or `powertrip up`'s log).",
)
@click.option(
    "--tls-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="The cluster's certificates (`powertrip certs --out DIR`; `powertrip up`: "
    "OUTPUT/tls): ca.pem and the operator's operator.pem / operator.key.",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Plaintext, for an aggregator started with POWERTRIP_INSECURE=1 (no identity checked).",
)
@click.option(
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The model file: NAME.safetensors, with its card NAME.json beside it.",
)
@click.option(
    "--max-gib",
    type=click.FloatRange(min=0, min_open=True),
    default=8.0,
    show_default=True,
    help="Refuse a model larger than this many GiB before reading its tensors.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds the whole pull may take.",
)
def pull(
    address: str,
    tls_dir: Path | None,
    insecure: bool,
    output: Path,
    max_gib: float,
    timeout: float,
) -> None:
    """Write the aggregator's current model (the last round's) to a model file.

    The model loads with `powertrip.load_model(FILE)`; its card (FILE's .json) says the round,
    the accuracy and loss the aggregator reported for it, and the run's settings.
    """
    import grpc

    from powertrip.learning.model_file import ModelFileError, save_model
    from powertrip.services.common.config import ConfigError
    from powertrip.services.common.tensor_stream import StreamError

    if insecure == (tls_dir is not None):
        fail("model pull: give --tls-dir DIR (mutual TLS as the operator), or --insecure")
    try:
        channel = operator_channel(address, tls_dir)
    except ConfigError as exc:
        fail(f"model pull: --tls-dir {tls_dir}: {exc}")
    try:
        with channel:
            state, card = pull_model(channel, int(max_gib * GIB), timeout)
    except grpc.RpcError as exc:
        code = exc.code().name if hasattr(exc, "code") else "ERROR"
        details = exc.details() if hasattr(exc, "details") else str(exc)
        fail(f"model pull from {address}: {code}: {details}")
    except (StreamError, ModelFileError) as exc:
        fail(f"model pull from {address}: refused what arrived: {exc}")
    try:
        path = save_model(output, state, card)
    except OSError as exc:
        fail(f"model pull: --output {output}: {exc.strerror or exc}")
    accuracy = "not evaluated" if card.accuracy is None else f"accuracy {card.accuracy:.4f}"
    out.print(
        f"model of round {card.round} ({accuracy}, workload {card.workload}) written to {path} "
        f"and {path.with_suffix('.json')}",
        highlight=False,
    )


def operator_channel(address: str, tls_dir: Path | None) -> grpc.Channel:
    """A channel to the aggregator as the operator (mutual TLS), or plaintext without a dir."""
    import grpc

    from powertrip.services.cli.certs import tls_env
    from powertrip.services.common.config import ServiceConfig, load_config
    from powertrip.services.common.grpc_client import make_channel
    from powertrip.services.common.identity import AGGREGATOR, OPERATOR

    if tls_dir is None:
        return grpc.insecure_channel(address)
    cfg = load_config(ServiceConfig, tls_env(tls_dir, OPERATOR))
    return make_channel(address, cfg, AGGREGATOR)


def pull_model(
    channel: grpc.Channel, max_bytes: int, timeout_s: float
) -> tuple[dict[str, NDArray], ModelCard]:
    """The aggregator's current model (its ``state_dict`` as arrays) and card, checked as every
    tensor stream is (sizes, order, finite values, checksum) and at most ``max_bytes``."""
    from powertrip.learning.model_file import ModelCard
    from powertrip.services.common.tensor_receiver import TensorStreamReceiver
    from powertrip.services.common.tensor_stream import StreamError
    from powertrip.v1 import aggregator_pb2, aggregator_pb2_grpc

    stub = aggregator_pb2_grpc.AggregatorServiceStub(channel)
    replies = stub.GetModel(aggregator_pb2.GetModelRequest(), timeout=timeout_s)
    first = next(replies, None)
    if first is None or first.WhichOneof("part") != "card_json":
        raise StreamError("sequence", "the reply did not open with the model card")
    card = ModelCard.from_json(first.card_json, "the aggregator's model card")
    with TensorStreamReceiver(max_total_bytes=max_bytes) as rx:
        rx.consume(replies)
        return rx.arrays(), card
