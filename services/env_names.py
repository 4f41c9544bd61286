"""Every ``POWERTRIP_*`` name some service reads, and a warning at start for any other.

A service ignores the names of the other services' settings (one environment file serves them
all), so without this a misspelt name, e.g. ``POWERTRIP_AGREGATION=median``, would be ignored
too and leave the default on with no word. The names are derived from the declared settings
(every service's config model) and the few variables read directly (each named by the module
that reads it), so a new setting is known the moment it is declared. It sits at the root of
the services package, beside none of them, because it is the one place that reads all three
services' declarations (``services/common`` belongs to no service and imports none).
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
from collections.abc import Mapping

from powertrip.services.common.settings import PREFIX, env_name

logger = logging.getLogger(__name__)


@functools.cache
def known_names() -> frozenset[str]:
    """The ``POWERTRIP_*`` variables of every service's settings, old names included."""
    # lazily: the services' configs import this package's modules
    from powertrip.fetch import DATA_DIR_VARIABLE
    from powertrip.learning.datasets.record import CACHE_DIR_VARIABLE
    from powertrip.services.aggregator.config import AggregatorConfig
    from powertrip.services.common.fault_points import VARIABLE as FAULT_INJECT
    from powertrip.services.profiler.config import ProfilerConfig
    from powertrip.services.worker.config import WorkerConfig

    names = {CACHE_DIR_VARIABLE, DATA_DIR_VARIABLE, FAULT_INJECT}
    for cls in (AggregatorConfig, ProfilerConfig, WorkerConfig):
        names.update(env_name(field) for field in cls.model_fields)
    return frozenset(names)


def unknown_names(env: Mapping[str, str]) -> dict[str, str | None]:
    """Each ``POWERTRIP_*`` name in ``env`` that no service reads -> the closest known name
    (None when nothing is close)."""
    known = known_names()
    # compared without the prefix they all share, which would make any two names look alike
    suffixes = {name.removeprefix(PREFIX): name for name in known}
    out: dict[str, str | None] = {}
    for name in sorted(env):
        if name.startswith(PREFIX) and name not in known:
            close = difflib.get_close_matches(name.removeprefix(PREFIX), suffixes, n=1)
            out[name] = suffixes[close[0]] if close else None
    return out


def warn_unknown_names(service: str, env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """One warning per unknown ``POWERTRIP_*`` variable, naming the closest known one."""
    unknown = unknown_names(os.environ if env is None else env)
    for name, close in unknown.items():
        hint = f"did you mean {close}?" if close else f"powertrip-{service} --help lists them"
        logger.warning(
            "%s is not a setting of any PowerTrip service, so it is ignored: %s", name, hint
        )
    return unknown
