"""The aggregator's side of update codecs on the wire (``powertrip.services.common.update_codec``).

The run assigns the codec; an update must name that codec in its header (``codec``), and its
stream must be laid out exactly as the codec lays out the model's tensors (``coded_specs``), so a
payload larger, smaller or shaped otherwise is refused from its tensor header, before any chunk.
A verified stream is decoded whole (its values checked: ``decode_update``) and handed to the
round as a ``DecodedUpdate``; a refused one fails its site, and the round goes on without it.
Every upload path takes it: a whole update, one rank's shard (the shard's rows of every tensor,
coded on their own: ``receive_update`` of its ``shard_specs``) and a curtailment sub-round's update.
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

__all__ = ["assigned_codec", "check_header", "receive_update"]


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


def receive_update(
    receive: Callable[..., Any],
    collector: Any,
    site: int,
    head: Any,
    specs: Sequence[TensorSpec],
    requests: Iterator[Any],
    what: str,
    fail: Callable[[str], None],
    codec: Codec,
    sink_for: Callable[[], Any] | None = None,
) -> Any:
    """An update (``head.codec`` already checked) laid out as ``specs`` (the model's tensors, or
    one rank's shard of them: ``shard_specs``), verified: its raw rows (``receive``'s receiver,
    streamed to ``sink_for``'s sink), or under a codec its payload (laid out as the codec lays out
    ``specs``) decoded whole, a ``DecodedUpdate``."""
    if codec.name == NONE:
        return receive(collector, site, head, specs, requests, what, fail, sink_for)
    rx = receive(collector, site, head, coded_specs(specs, codec), requests, what, fail)
    try:
        update = DecodedUpdate(decode_update(specs, codec, rx.arrays()), rx.total_bytes)
    except StreamError as exc:
        fail(exc.reason)
        metrics.UPDATES.labels(exc.reason).inc()
        raise BadRequest(f"{what} rejected: {exc}") from None
    finally:
        rx.close()
    return update
