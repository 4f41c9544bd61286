"""The node side: answer the server's PowerTrip property query from a ClientApp.

Flower's server cannot read a node's config; it asks. ``register_property_query(app)`` adds a
query handler (message type ``query.powertrip_properties``) that replies with the node's
properties in a ConfigRecord: by default the node config itself, so a SuperNode started with
``--node-config 'power-fraction=0.6 rtt-ms=24 bandwidth-mbps=4000'`` needs no code. A function
can compute them instead (a site's power trace at the server's emulated time ``now_s``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from numbers import Integral, Real
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

#: the query's action name: Flower routes ``query.powertrip_properties`` to the handler
QUERY_ACTION = "powertrip_properties"
#: the request's ConfigRecord (holding ``NOW_S``) and the reply's ConfigRecord of properties
REQUEST_KEY = "config"
REPLY_KEY = "properties"
#: the server's emulated clock, in seconds, when it asks (trace-driven nodes answer for it)
NOW_S = "now-s"

#: (node context, server's emulated time in s) -> the node's properties
PropertyFn = Callable[[Context, float], Mapping[str, Any]]


def node_config_properties(context: Context, now_s: float) -> dict[str, Any]:
    """The default answer: the node config as given (``partition-id`` included in simulation)."""
    return dict(context.node_config)


def _config_value(key: str, value: Any) -> bool | int | float | str:
    """ConfigRecords hold plain scalars; numpy scalars (a trace's float64) become Python ones."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        return float(value)
    raise TypeError(f"node property {key!r} must be a number, bool or str, got {value!r}")


def properties_reply(
    message: Message, context: Context, properties: PropertyFn | None = None
) -> Message:
    """The reply to one property query (also usable from a hand-written query handler)."""
    now_s = 0.0
    if REQUEST_KEY in message.content.config_records:
        sent = message.content.config_records[REQUEST_KEY].get(NOW_S, 0.0)
        if not isinstance(sent, int | float):
            raise TypeError(f"property query: {NOW_S!r} must be a number, got {sent!r}")
        now_s = float(sent)
    props = (properties or node_config_properties)(context, now_s)
    record = ConfigRecord({k: _config_value(k, v) for k, v in props.items()})
    return Message(RecordDict({REPLY_KEY: record}), reply_to=message)


def register_property_query(app: ClientApp, properties: PropertyFn | None = None) -> None:
    """Let ``app`` answer PowerTrip's property query (call once, where the ClientApp is made).

    Without ``properties`` the node answers with its node config, which must then hold
    ``power-fraction``, ``rtt-ms`` and ``bandwidth-mbps`` (``site_info``).
    """

    @app.query(QUERY_ACTION)
    def powertrip_properties(message: Message, context: Context) -> Message:
        return properties_reply(message, context, properties)
