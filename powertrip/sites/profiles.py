"""Sites, and the two sources the rest of the system reads them through.

A site is static geography (distance, link); its available power and measured link quality can
change over time, so they come from small ``PowerSource`` / ``LinkSource`` interfaces that the
emulator, the profiler and (later) trace readers or live probes implement.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from powertrip.config.sites import DistanceMode
from powertrip.sites.timing import bandwidth_bps, comm_time_s, propagation_delay_s

PAPER_NEAR_SITES = 22  # sites within 1000 mi in the paper's fixed-radius baseline
PAPER_NUM_SITES = 100
#: the power an unavailable site shows a policy: ranks it last without dividing by zero
UNAVAILABLE_POWER = 1e-9


@dataclass(frozen=True)
class SiteSet:
    """Static description of N sites, struct-of-arrays so policies can rank with numpy."""

    distance_mi: NDArray[np.float64]
    bandwidth_bps: NDArray[np.float64]
    latency_s: NDArray[np.float64]
    base_power: NDArray[np.float64]  # P_i under the uniform power model

    def __post_init__(self) -> None:
        n = self.distance_mi.shape
        for name in ("bandwidth_bps", "latency_s", "base_power"):
            if getattr(self, name).shape != n:
                raise ValueError(f"SiteSet.{name} must have shape {n}")

    @property
    def size(self) -> int:
        return int(self.distance_mi.size)


def generate_sites(
    num_sites: int,
    rng: np.random.Generator,
    distance_mode: DistanceMode = DistanceMode.STRATIFIED,
    power_range: tuple[float, float] = (0.1, 1.0),
    min_distance_mi: float = 100.0,
    max_distance_mi: float = 10_000.0,
    near_radius_mi: float = 1000.0,
) -> SiteSet:
    """The paper's emulated sites: distances (stratified or uniform), B(d), d/c, P ~ U(lo, hi)."""
    if num_sites < 1:
        raise ValueError(f"need at least one site, got {num_sites}")
    lo, hi = power_range
    if not 0 < lo <= hi <= 1:
        raise ValueError(f"power range must satisfy 0 < lo <= hi <= 1, got {power_range}")
    mode = DistanceMode(distance_mode)
    if mode is DistanceMode.STRATIFIED:
        near = round(num_sites * PAPER_NEAR_SITES / PAPER_NUM_SITES)
        d = np.concatenate(
            [
                rng.uniform(min_distance_mi, near_radius_mi, size=near),
                rng.uniform(near_radius_mi, max_distance_mi, size=num_sites - near),
            ]
        )
        d = d[rng.permutation(num_sites)]
    else:
        d = rng.uniform(min_distance_mi, max_distance_mi, size=num_sites)
    power = rng.uniform(lo, hi, size=num_sites)
    return SiteSet(
        distance_mi=d,
        bandwidth_bps=bandwidth_bps(d),
        latency_s=propagation_delay_s(d),
        base_power=power,
    )


def site_id(index: int) -> str:
    """The stable name of site ``index`` across services, metrics and logs."""
    return f"site-{index:03d}"


def site_index(name: str) -> int:
    """Inverse of ``site_id``; also accepts a bare index. ValueError names the bad id."""
    text = name.strip()
    digits = text.removeprefix("site-")
    if not digits.isdigit():
        raise ValueError(f"bad site id {name!r}: expected 'site-NNN' or an index")
    return int(digits)


def parse_site_list(spec: str) -> list[int]:
    """'site-000,site-004', '0-3' or '0,2,5-7' -> sorted unique indices."""
    out: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-") if not part.startswith("site-") else (part, "", "")
        if sep:
            a, b = site_index(lo), site_index(hi)
            if b < a:
                raise ValueError(f"bad site range {part!r}: end before start")
            out.update(range(a, b + 1))
        else:
            out.add(site_index(part))
    if not out:
        raise ValueError(f"no sites in {spec!r}")
    return sorted(out)


class PowerSource(Protocol):
    def power_at(self, t_s: float) -> NDArray[np.float64]:
        """Available power fraction in (0, 1] of every site at time t."""
        ...


class LinkSource(Protocol):
    def links_at(self, t_s: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(one-way latency s, bandwidth bit/s) of every site's link to the aggregator at time t."""
        ...


class StaticPower:
    """The paper's controlled setting: each site keeps its U(0.1, 1) draw for the whole run."""

    def __init__(self, power: NDArray[np.float64]) -> None:
        self._power = np.asarray(power, dtype=np.float64)

    def power_at(self, t_s: float) -> NDArray[np.float64]:
        return self._power


class ModelledLinks:
    """Links from the distance model (d/c, B(d)); the profiler substitutes measured ones."""

    def __init__(self, sites: SiteSet) -> None:
        self._latency = sites.latency_s
        self._bandwidth = sites.bandwidth_bps

    def links_at(self, t_s: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return self._latency, self._bandwidth


@dataclass(frozen=True)
class SiteProfile:
    """What the aggregator knows about every site when it picks a round's participants.

    ``available`` is the aggregator's liveness mask (a site whose worker missed its heartbeats
    is False): the round loop never asks an unavailable site to train. None means every site,
    which is all the emulator, the Flower adapter and the studies ever pass, so their results do
    not change. Keyword-only, so profiles that extend this one keep their positional fields.
    """

    power: NDArray[np.float64]
    comm_s: NDArray[np.float64]
    distance_mi: NDArray[np.float64]
    available: NDArray[np.bool_] | None = field(default=None, kw_only=True)

    @property
    def size(self) -> int:
        return int(self.power.size)

    @property
    def all_available(self) -> bool:
        return self.available is None or bool(np.all(self.available))

    def for_ranking(self) -> SiteProfile:
        """The profile a policy ranks: an unavailable site's power shrunk to ``UNAVAILABLE_POWER``
        so power-aware rankings put it last and pick an available replacement (a tiny positive
        power, not 0: rankings divide by power). Unchanged, the same object, when every site is
        available."""
        if self.all_available:
            return self
        assert self.available is not None
        power = np.where(self.available, self.power, UNAVAILABLE_POWER)
        return replace(self, power=power)

    def keep_available(self, selected: NDArray[np.int64]) -> NDArray[np.int64]:
        """``selected`` without the unavailable sites, in the same order."""
        if self.available is None:
            return selected
        return selected[self.available[selected]]


def profile_at(
    sites: SiteSet,
    power: PowerSource,
    links: LinkSource,
    t_s: float,
    update_bytes: float,
    round_trip: bool = False,
) -> SiteProfile:
    latency, bandwidth = links.links_at(t_s)
    return SiteProfile(
        power=power.power_at(t_s),
        comm_s=comm_time_s(latency, bandwidth, update_bytes, round_trip=round_trip),
        distance_mi=sites.distance_mi,
    )
