"""Flower nodes as PowerTrip sites: node ids <-> profile rows, and node properties -> SiteProfile.

PowerTrip's policies rank *sites* by their power fraction and link cost (``SiteProfile``); a
Flower server only knows node ids. A node describes its site with three properties, which the
ClientApp reads from its node config (``flower-supernode --node-config 'power-fraction=0.6
rtt-ms=24 bandwidth-mbps=4000'``) or computes, and reports when queried (``client.py``):

- ``power-fraction``: available power in (0, 1] (1 = the site trains at full speed);
- ``rtt-ms``: round-trip time to the server in milliseconds (one-way latency is half of it);
- ``bandwidth-mbps``: link bandwidth in megabits per second;
- ``distance-mi`` (optional): distance to the server, only for distance-based baselines; from
  the RTT at the speed of light in fibre when absent.

This module is plain numpy (no Flower import), so the mapping is testable without the extra.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from powertrip.sites.profiles import (
    LinkSource,
    ModelledLinks,
    PowerSource,
    SiteProfile,
    SiteSet,
    StaticPower,
)
from powertrip.sites.timing import METERS_PER_MILE, SPEED_IN_FIBRE_M_PER_S, comm_time_s

POWER_FRACTION = "power-fraction"
RTT_MS = "rtt-ms"
BANDWIDTH_MBPS = "bandwidth-mbps"
DISTANCE_MI = "distance-mi"
#: what every node must report; ``DISTANCE_MI`` is optional
REQUIRED_PROPERTIES = (POWER_FRACTION, RTT_MS, BANDWIDTH_MBPS)


class MissingNodeProperty(ValueError):
    """A node did not report a property PowerTrip needs (or reported an unusable value)."""

    def __init__(
        self, node_id: int, key: str, problem: str = "missing", hint: str | None = None
    ) -> None:
        hint = hint or (
            f"PowerTrip needs {', '.join(REQUIRED_PROPERTIES)} from every node: set them in "
            "the node config (--node-config 'power-fraction=0.5 rtt-ms=20 bandwidth-mbps=1000') "
            "or answer the query with powertrip.integrations.flower.register_property_query"
        )
        super().__init__(f"Flower node {node_id} reported no usable {key!r} ({problem}); {hint}")
        self.node_id = node_id
        self.key = key


class NodeIndex:
    """The round's nodes in a fixed order: row i of the profile is node ``node_ids[i]``.

    Policies return row positions; Flower addresses nodes by id. Sorting the ids makes the
    order independent of the order the grid lists them in.
    """

    def __init__(self, node_ids: Iterable[int]) -> None:
        self.node_ids: tuple[int, ...] = tuple(sorted({int(n) for n in node_ids}))
        self._row = {n: i for i, n in enumerate(self.node_ids)}

    def __len__(self) -> int:
        return len(self.node_ids)

    def rows(self, node_ids: Iterable[int]) -> NDArray[np.int64]:
        """Profile rows of ``node_ids``; ValueError naming a node this index does not hold."""
        out = []
        for n in node_ids:
            if int(n) not in self._row:
                raise ValueError(f"Flower node {n} is not among this round's nodes")
            out.append(self._row[int(n)])
        return np.asarray(out, dtype=np.int64)

    def nodes(self, rows: Iterable[int]) -> list[int]:
        """Node ids of profile ``rows`` (a policy's selection), in the given order."""
        return [self.node_ids[int(r)] for r in rows]


def _number(props: Mapping[str, Any], node_id: int, key: str) -> float:
    if key not in props:
        raise MissingNodeProperty(node_id, key)
    value = props[key]
    if isinstance(value, bool):
        raise MissingNodeProperty(node_id, key, f"a bool, {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise MissingNodeProperty(node_id, key, f"not a number: {value!r}") from None
    if not np.isfinite(number):
        raise MissingNodeProperty(node_id, key, f"not finite: {value!r}")
    return number


def rtt_distance_mi(rtt_ms: NDArray[np.float64]) -> NDArray[np.float64]:
    """The distance light in fibre covers in half the RTT (inverse of ``propagation_delay_s``)."""
    return np.asarray(rtt_ms, dtype=np.float64) / 2e3 * SPEED_IN_FIBRE_M_PER_S / METERS_PER_MILE


def profile_from_properties(
    index: NodeIndex,
    properties: Mapping[int, Mapping[str, Any]],
    update_bytes: float,
    round_trip: bool = False,
) -> SiteProfile:
    """The SiteProfile of ``index``'s nodes from what each reported (Eq. 3 link cost).

    Raises ``MissingNodeProperty`` naming the first node and key that is missing or invalid.
    """
    power, rtt, bw, dist = [], [], [], []
    for n in index.node_ids:
        if n not in properties:
            raise MissingNodeProperty(n, POWER_FRACTION, "the node sent no properties")
        props = properties[n]
        p = _number(props, n, POWER_FRACTION)
        if not 0 < p <= 1:
            raise MissingNodeProperty(n, POWER_FRACTION, f"{p} is outside (0, 1]")
        r = _number(props, n, RTT_MS)
        if r < 0:
            raise MissingNodeProperty(n, RTT_MS, f"{r} < 0")
        b = _number(props, n, BANDWIDTH_MBPS)
        if b <= 0:
            raise MissingNodeProperty(n, BANDWIDTH_MBPS, f"{b} <= 0")
        power.append(p)
        rtt.append(r)
        bw.append(b)
        dist.append(_number(props, n, DISTANCE_MI) if DISTANCE_MI in props else np.nan)
    rtt_ms = np.asarray(rtt, dtype=np.float64)
    distance = np.asarray(dist, dtype=np.float64)
    missing = np.isnan(distance)
    distance[missing] = rtt_distance_mi(rtt_ms[missing])
    return SiteProfile(
        power=np.asarray(power, dtype=np.float64),
        comm_s=comm_time_s(rtt_ms / 2e3, np.asarray(bw) * 1e6, update_bytes, round_trip),
        distance_mi=distance,
    )


def site_sources(
    sites: SiteSet, power: PowerSource | None = None, links: LinkSource | None = None
) -> tuple[PowerSource, LinkSource]:
    """A SiteSet's power and link sources: those given, else its static base power and the
    distance link model (what a node standing for one of its sites reports by default)."""
    return power or StaticPower(sites.base_power), links or ModelledLinks(sites)


def site_properties(
    sites: SiteSet,
    site: int,
    t_s: float = 0.0,
    power: PowerSource | None = None,
    links: LinkSource | None = None,
) -> dict[str, float]:
    """What a node standing for site ``site`` of a PowerTrip SiteSet reports at time ``t_s``
    (static base power and the distance link model unless sources are given): how an emulated
    federation gives every Flower node the power and link of one generated site."""
    if not 0 <= site < sites.size:
        raise ValueError(f"site {site} is not in a SiteSet of {sites.size} sites")
    power, links = site_sources(sites, power, links)
    p = power.power_at(t_s)
    latency, bandwidth = links.links_at(t_s)
    return {
        POWER_FRACTION: float(p[site]),
        RTT_MS: float(latency[site]) * 2e3,
        BANDWIDTH_MBPS: float(bandwidth[site]) / 1e6,
        DISTANCE_MI: float(sites.distance_mi[site]),
    }


def rows_of_sites(index: NodeIndex, node_sites: Mapping[int, int], num_sites: int) -> list[int]:
    """Which SiteSet row stands for each of ``index``'s nodes; ValueError names a node with no
    site or a site outside the set."""
    out = []
    for n in index.node_ids:
        if n not in node_sites:
            raise ValueError(f"Flower node {n} is mapped to no PowerTrip site")
        s = int(node_sites[n])
        if not 0 <= s < num_sites:
            raise ValueError(f"Flower node {n} is mapped to site {s}, outside 0..{num_sites - 1}")
        out.append(s)
    return out


def sub_profile(profile: SiteProfile, rows: Sequence[int]) -> SiteProfile:
    """The rows of a SiteSet-wide profile, in node order."""
    idx = np.asarray(rows, dtype=np.int64)
    return SiteProfile(profile.power[idx], profile.comm_s[idx], profile.distance_mi[idx])
