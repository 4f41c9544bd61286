"""How a policy makes itself known by name: the table behind ``powertrip.selection.registry``.

A module that defines a policy calls ``register_policy`` when it is imported, with the names it
answers to, the modes it serves and a factory that builds a fresh instance from the run's
``PolicyContext``. A user registers a policy of their own the same way, from their code, and
runs it by name. The table lives here, below every policy module, so that each of them
registers without importing the registry that loads them all (no import circle).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from powertrip.config.curtailment import CurtailmentConfig
from powertrip.config.footprint import FootprintSettings
from powertrip.config.sites import RoundTimeModel


class PolicyMode(StrEnum):
    """The two kinds of run that build policies by name; a name may mean a different policy in
    each (``powertrip`` is Algorithm 1 with each mode's own round-time estimate)."""

    #: synchronous rounds: the PowerTrip study, the aggregator service, the Flower strategy
    ROUNDS = "rounds"
    #: wall-clock rounds over curtailed sites: the curtailment study and its service
    CURTAILMENT = "curtailment"


class WallClockTimer(Protocol):
    """How long a wall-clock round lasts for each site alone (``curtailment.WallClockRounds``)."""

    def site_round_s(
        self, power: NDArray[np.float64], comm_s: NDArray[np.float64]
    ) -> NDArray[np.float64]: ...


@dataclass(frozen=True)
class PolicyContext:
    """What a run hands the policies it builds. A factory reads only the fields it needs; the
    ``need_*`` accessors name the policy when a run did not provide a field it needs."""

    mode: PolicyMode = PolicyMode.ROUNDS
    #: the static sweep's best count (``static-optimal`` and ``random`` use it)
    k_star: int | None = None
    #: ``GreedyConfig`` fields that override Algorithm 1's (``GreedyParams.overrides``)
    greedy_overrides: Mapping[str, Any] = field(default_factory=dict)
    #: the system's round-time model: the project's variants estimate rounds with it
    round_time_model: RoundTimeModel = RoundTimeModel.PER_SITE_MAX
    #: the radius of ``fixed-radius``
    radius_mi: float = 1000.0
    #: the grid and weights ``powertrip-joint`` prices (its defaults when None)
    footprint: FootprintSettings | None = None
    #: curtailment runs: their settings and their wall-clock rounds
    curtailment: CurtailmentConfig | None = None
    wall_clock: WallClockTimer | None = None

    @classmethod
    def for_curtailment(cls, cfg: CurtailmentConfig, wall_clock: WallClockTimer) -> PolicyContext:
        """A curtailment run's context: who trains in a round is every connected site
        (``curtailment``) or Algorithm 1 over these wall-clock rounds (``powertrip``; with the
        carbon term for ``combined``)."""
        return cls(mode=PolicyMode.CURTAILMENT, curtailment=cfg, wall_clock=wall_clock)

    def need_k_star(self, policy: str) -> int:
        if self.k_star is None:
            raise ValueError(f"policy {policy!r} needs k* from a static sweep")
        return self.k_star

    def need_curtailment(self, policy: str) -> tuple[CurtailmentConfig, WallClockTimer]:
        if self.curtailment is None or self.wall_clock is None:
            raise ValueError(
                f"policy {policy!r} needs a curtailment run's settings and wall-clock rounds"
            )
        return self.curtailment, self.wall_clock


#: builds a fresh policy (a ``SelectionPolicy``) for the name asked for and the run's context
PolicyFactory = Callable[[str, PolicyContext], object]

_PLACEHOLDER = re.compile(r"<[A-Za-z_]+>")
_WHOLE = "[1-9][0-9]*"  # what a placeholder stands for: a positive whole number


@dataclass(frozen=True)
class _Entry:
    factory: PolicyFactory
    pattern: re.Pattern[str] | None  # for a name with a placeholder, such as ``static-<k>``


_TABLE: dict[PolicyMode, dict[str, _Entry]] = {mode: {} for mode in PolicyMode}


def _modes(modes: Iterable[PolicyMode | str]) -> tuple[PolicyMode, ...]:
    chosen = tuple(modes) if not isinstance(modes, str) else (modes,)
    known = {m.value for m in PolicyMode}
    bad = [m for m in chosen if m not in known]
    if bad or not chosen:
        raise ValueError(f"policy modes must be among {', '.join(sorted(known))}, got {bad}")
    return tuple(PolicyMode(m) for m in chosen)


def register_policy(
    name: str,
    factory: PolicyFactory,
    *,
    modes: Iterable[PolicyMode | str] = (PolicyMode.ROUNDS,),
    replace: bool = False,
) -> None:
    """Make ``name`` buildable by ``build_policy`` in ``modes``: ``factory(name, context)``
    returns a fresh ``SelectionPolicy`` (policies keep per-run state, so never a shared one).

    ``<k>`` in a name stands for a positive whole number (``static-<k>`` answers to
    ``static-40``), and the factory gets the concrete name. A name already registered in a
    mode is refused unless ``replace``; an exact name wins over a pattern that also matches.
    """
    if not name or name != name.strip() or any(c.isspace() for c in name):
        raise ValueError(f"a policy name needs characters and no spaces, got {name!r}")
    if not callable(factory):
        raise TypeError(f"policy {name!r}: the factory must be callable, got {factory!r}")
    parts = _PLACEHOLDER.split(name)
    pattern = re.compile(_WHOLE.join(map(re.escape, parts))) if len(parts) > 1 else None
    chosen = _modes(modes)
    for mode in chosen:
        if name in _TABLE[mode] and not replace:
            raise ValueError(f"policy {name!r} is already registered for {mode} runs")
    for mode in chosen:
        _TABLE[mode][name] = _Entry(factory, pattern)


def unregister_policy(name: str, *, modes: Iterable[PolicyMode | str] = tuple(PolicyMode)) -> None:
    """Forget ``name`` in ``modes`` (where it is registered)."""
    for mode in _modes(modes):
        _TABLE[mode].pop(name, None)


def registered_names(mode: PolicyMode) -> list[str]:
    """Every name of ``mode`` in registration order, patterns as written (``static-<k>``)."""
    return list(_TABLE[mode])


def find_factory(name: str, mode: PolicyMode) -> PolicyFactory | None:
    """The factory ``name`` resolves to in ``mode``: its exact entry, else the first pattern
    that matches it whole; None for an unknown name."""
    table = _TABLE[mode]
    entry = table.get(name)
    if entry is not None and entry.pattern is None:
        return entry.factory
    for entry in table.values():
        if entry.pattern is not None and entry.pattern.fullmatch(name):
            return entry.factory
    return None
