"""The aggregator's side of update codecs on the wire (``powertrip.services.common.update_codec``).

The run assigns the codec; an update must name that codec in its header (``codec``), and its
stream must be laid out exactly as the codec lays out the model's tensors (``coded_specs``), so a
payload larger, smaller or shaped otherwise is refused from its tensor header, before any chunk.
A verified stream is decoded whole (its values checked: ``decode_update``) and handed to the
round as a ``DecodedUpdate``; a refused one fails its site, and the round goes on without it.
Every upload path takes it: a whole update, one rank's shard (the shard's rows of every tensor,
coded on their own: ``receive_shard``) and a curtailment sub-round's update.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from powertrip.codecs import Codec, get_codec
from powertrip.services.aggregator import metrics
from powertrip.services.common.errors import BadRequest
from powertrip.services.common.tensor_stream import StreamError, TensorSpec, shard_specs
from powertrip.services.common.update_codec import (
    NONE,
    DecodedUpdate,
    coded_specs,
    decode_update,
    wire_codec,
)

__all__ = ["assigned_codec", "check_header", "receive_coded", "receive_shard"]


def assigned_codec(run: Any) -> Codec:
    """The codec ``run`` assigns its workers: its configuration's (PowerTrip mode's
    ``experiment``, curtailment mode's ``config``); none in a run without one."""
    settings = getattr(run, "experiment", None) or getattr(run, "config", None)
    return get_codec(getattr(settings, "codec", NONE))


def check_header(head: Any, codec: Codec) -> None:
    """StreamError unless the update header names the run's codec."""
    got = wire_codec(head.codec)
    if got != codec.name:
        raise StreamError(
            "codec",
            f"{head.site_id}: field 'codec' is {got!r}, but the run assigned {codec.name!r}",
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


def receive_shard(
    receive: Callable[..., Any],
    collector: Any,
    site: int,
    head: Any,
    model: Sequence[TensorSpec],
    requests: Iterator[Any],
    what: str,
    fail: Callable[[str], None],
    codec: Codec,
) -> Any:
    """One rank's shard of a site's update (``head.shard_index`` of ``head.shard_count``),
    verified: the raw rows of every tensor, or under a codec their payload (laid out as the
    codec lays out the shard's rows), decoded."""
    specs = shard_specs(model, head.shard_count, head.shard_index)
    if codec.name == NONE:
        return receive(collector, site, head, specs, requests, what, fail)
    return receive_coded(receive, collector, site, head, specs, requests, what, fail, codec)
