"""The aggregator's side of update codecs on the wire (``powertrip.services.common.update_codec``).

The run assigns the codec; an update must name that codec in its header (``codec``), and its
stream must be laid out exactly as the codec lays out the model's tensors (``coded_specs``), so a
payload larger, smaller or shaped otherwise is refused from its tensor header, before any chunk.
A verified stream is decoded whole (its values checked: ``decode_update``) and handed to the
round as a ``DecodedUpdate``; a refused one fails its site, and the round goes on without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from powertrip.codecs import Codec, get_codec
from powertrip.services.aggregator import metrics
from powertrip.services.common.errors import BadRequest
from powertrip.services.common.tensor_stream import StreamError, TensorSpec
from powertrip.services.common.update_codec import (
    NONE,
    DecodedUpdate,
    coded_specs,
    decode_update,
    wire_codec,
)

__all__ = ["assigned_codec", "check_header", "receive_coded"]


def assigned_codec(run: Any) -> Codec:
    """The codec ``run`` assigns its workers (PowerTrip mode's ``experiment.codec``; none in a
    mode without one)."""
    return get_codec(getattr(getattr(run, "experiment", None), "codec", NONE))


def check_header(head: Any, codec: Codec, sharded: bool = False) -> None:
    """StreamError unless the update header names the run's codec (and, with a codec, is one
    whole stream: per-rank shards travel raw only)."""
    got = wire_codec(head.codec)
    if got != codec.name:
        raise StreamError(
            "codec",
            f"{head.site_id}: field 'codec' is {got!r}, but the run assigned {codec.name!r}",
        )
    if sharded and codec.name != NONE:
        raise StreamError(
            "codec", f"{head.site_id}: per-rank shards cannot carry a {codec.name} update"
        )


def receive_coded(
    receive: Callable[..., Any],
    collector: Any,
    site: int,
    head: Any,
    model: Sequence[TensorSpec],
    requests: Iterator[Any],
    what: str,
    fail: Callable[[str], None],
    codec: Codec,
) -> DecodedUpdate:
    """A coded update (``head.codec`` already checked), verified and decoded."""
    rx = receive(collector, site, head, coded_specs(model, codec), requests, what, fail)
    try:
        update = DecodedUpdate(decode_update(model, codec, rx.arrays()), rx.total_bytes)
    except StreamError as exc:
        fail(exc.reason)
        metrics.UPDATES.labels(exc.reason).inc()
        raise BadRequest(f"{what} rejected: {exc}") from None
    finally:
        rx.close()
    return update
