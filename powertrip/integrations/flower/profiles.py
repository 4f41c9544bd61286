"""Where a round's SiteProfile comes from: the nodes' own reports, or a PowerTrip SiteSet.

Both sources give the strategy one profile row per connected node (``NodeIndex`` order) at the
emulated clock's time:

- ``ReportedProperties``: each node reports ``power-fraction``, ``rtt-ms`` and
  ``bandwidth-mbps`` when queried (``client.register_property_query``); asked once per node,
  or every round with ``refresh=True`` when power follows a trace on the node.
- ``TracedSites``: the server holds the sites (``generate_sites``) and their power and link
  sources (traces included), and maps each node to one site, by an explicit mapping or by a
  property the node reports once (``partition-id`` in simulation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from powertrip.integrations.flower.client import NOW_S, QUERY_ACTION, REPLY_KEY, REQUEST_KEY
from powertrip.integrations.flower.site_info import (
    MissingNodeProperty,
    NodeIndex,
    profile_from_properties,
    rows_of_sites,
    site_sources,
    sub_profile,
)
from powertrip.sites.profiles import LinkSource, PowerSource, SiteProfile, SiteSet
from powertrip.sites.profiles import profile_at as siteset_profile_at

QUERY_TYPE = f"{MessageType.QUERY}.{QUERY_ACTION}"
#: how long the server waits for the nodes' property replies, in seconds. The first query of a
#: simulation waits for ClientApps that are still starting; the former 60 s failed 2 of 3 runs
#: of the example on a busy two-core machine. The profile sources take another ``timeout``.
PROPERTY_QUERY_TIMEOUT_S = 300.0


class NodeProfiles(Protocol):
    """A source of the round's SiteProfile, one row per node of ``index``."""

    def profile(
        self, grid: Grid, index: NodeIndex, now_s: float, update_bytes: float
    ) -> SiteProfile: ...


def query_properties(
    grid: Grid,
    node_ids: Sequence[int],
    now_s: float,
    timeout: float | None = PROPERTY_QUERY_TIMEOUT_S,
) -> dict[int, dict[str, Any]]:
    """Ask ``node_ids`` for their properties; RuntimeError naming the nodes that failed or
    did not answer within ``timeout`` seconds (None: wait as long as it takes)."""
    messages = [
        Message(
            content=RecordDict({REQUEST_KEY: ConfigRecord({NOW_S: float(now_s)})}),
            message_type=QUERY_TYPE,
            dst_node_id=int(n),
        )
        for n in node_ids
    ]
    found: dict[int, dict[str, Any]] = {}
    failed: list[str] = []
    answered: set[int] = set()
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = int(reply.metadata.src_node_id)
        answered.add(node)
        if reply.has_error():
            failed.append(f"node {node}: {reply.error.reason}")
        elif REPLY_KEY not in reply.content.config_records:
            failed.append(f"node {node}: no {REPLY_KEY!r} ConfigRecord in its reply")
        else:
            found[node] = dict(reply.content.config_records[REPLY_KEY])
    failed += [f"node {n}: no reply within {timeout} s" for n in node_ids if n not in answered]
    if failed:
        raise RuntimeError(
            "PowerTrip's property query failed (does the ClientApp call "
            "powertrip.integrations.flower.register_property_query(app)?): " + "; ".join(failed)
        )
    return found


class ReportedProperties:
    """Profiles from what the nodes report (``site_info`` names the keys).

    ``refresh=False`` asks each node once, when it first shows up: static sites, and one
    query per node for a whole run. ``refresh=True`` asks every connected node every round,
    sending the emulated time so a node can answer from its power trace. ``timeout``: seconds
    to wait for the replies (``PROPERTY_QUERY_TIMEOUT_S``; None: no limit).
    """

    def __init__(
        self,
        refresh: bool = False,
        timeout: float | None = PROPERTY_QUERY_TIMEOUT_S,
        round_trip: bool = False,
    ) -> None:
        self.refresh = refresh
        self.timeout = timeout
        self.round_trip = round_trip
        self.properties: dict[int, dict[str, Any]] = {}

    def profile(
        self, grid: Grid, index: NodeIndex, now_s: float, update_bytes: float
    ) -> SiteProfile:
        ask = [n for n in index.node_ids if self.refresh or n not in self.properties]
        if ask:
            self.properties.update(query_properties(grid, ask, now_s, self.timeout))
        return profile_from_properties(index, self.properties, update_bytes, self.round_trip)


class TracedSites:
    """Profiles of a PowerTrip ``SiteSet`` (static power and distance links unless sources are
    given), one site per node.

    ``node_sites`` maps node id -> site index. Without it each node is asked once for
    ``site_key`` (default ``partition-id``, which every simulated node has in its config), so
    node i of a simulation stands for site i whatever id Flower gave it. ``timeout`` as in
    ``ReportedProperties``.
    """

    def __init__(
        self,
        sites: SiteSet,
        power: PowerSource | None = None,
        links: LinkSource | None = None,
        node_sites: Mapping[int, int] | None = None,
        site_key: str = "partition-id",
        timeout: float | None = PROPERTY_QUERY_TIMEOUT_S,
        round_trip: bool = False,
    ) -> None:
        self.sites = sites
        self.power, self.links = site_sources(sites, power, links)
        self.node_sites: dict[int, int] = dict(node_sites or {})
        self._ask = node_sites is None
        self.site_key = site_key
        self.timeout = timeout
        self.round_trip = round_trip

    def profile(
        self, grid: Grid, index: NodeIndex, now_s: float, update_bytes: float
    ) -> SiteProfile:
        unknown = [n for n in index.node_ids if n not in self.node_sites]
        if unknown and self._ask:
            for node, props in query_properties(grid, unknown, now_s, self.timeout).items():
                if self.site_key not in props or isinstance(props[self.site_key], bool):
                    hint = "TracedSites maps nodes to sites by it; or pass node_sites={id: site}"
                    raise MissingNodeProperty(node, self.site_key, hint=hint)
                self.node_sites[node] = int(props[self.site_key])
        rows = rows_of_sites(index, self.node_sites, self.sites.size)
        full = siteset_profile_at(
            self.sites, self.power, self.links, now_s, update_bytes, self.round_trip
        )
        return sub_profile(full, rows)
