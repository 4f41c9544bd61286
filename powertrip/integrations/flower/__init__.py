"""PowerTrip inside Flower: ``pip install 'powertrip[flower]'`` (Flower 1.41, Message API).

- ``PowerTripStrategy``: a Flower ``FedAvg`` whose training nodes are chosen each round by a
  PowerTrip policy (a site ranking + Algorithm 1's greedy count) from the nodes' power and link;
- ``TimedFedAvg``: Flower's FedAvg unchanged (its own node sampling), on the same emulated clock,
  so both report time-to-accuracy in emulated datacenter time;
- ``ReportedProperties`` / ``TracedSites``: where the per-node power and link come from (the
  nodes' reports, or a PowerTrip ``SiteSet`` with its traces), asked with a timeout of
  ``PROPERTY_QUERY_TIMEOUT_S`` (300 s) unless given one;
- ``register_property_query``: the ClientApp side of the nodes' reports;
- ``recipe_to_config`` / ``recipe_from_config``: the local optimizer recipe
  (``LocalOptimizer``) in the train ConfigRecord, sent by the strategies' ``local_optimizer``.

Importing this package checks that Flower is installed and says how to get it; the names load
on first use, so listing the package (as the layering test does) imports no Flower.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from powertrip.lazy import lazy_exports

if importlib.util.find_spec("flwr") is None:
    raise ImportError(
        "powertrip.integrations.flower needs Flower, which is not installed: "
        "pip install 'powertrip[flower]'"
    )

#: public name -> the module of this package defining it
_EXPORTS = {
    "PowerTripStrategy": ".strategy",
    "DEFAULT_POLICY": ".strategy",
    "TimedFedAvg": ".timed",
    "NodeProfiles": ".profiles",
    "ReportedProperties": ".profiles",
    "TracedSites": ".profiles",
    "query_properties": ".profiles",
    "PROPERTY_QUERY_TIMEOUT_S": ".profiles",
    "register_property_query": ".client",
    "properties_reply": ".client",
    "NodeIndex": ".site_info",
    "MissingNodeProperty": ".site_info",
    "profile_from_properties": ".site_info",
    "site_properties": ".site_info",
    "POWER_FRACTION": ".site_info",
    "RTT_MS": ".site_info",
    "BANDWIDTH_MBPS": ".site_info",
    "DISTANCE_MI": ".site_info",
    "RECIPE_PREFIX": ".recipe",
    "recipe_from_config": ".recipe",
    "recipe_to_config": ".recipe",
}
__all__ = [
    "BANDWIDTH_MBPS",
    "DEFAULT_POLICY",
    "DISTANCE_MI",
    "MissingNodeProperty",
    "NodeIndex",
    "NodeProfiles",
    "POWER_FRACTION",
    "PROPERTY_QUERY_TIMEOUT_S",
    "PowerTripStrategy",
    "RECIPE_PREFIX",
    "RTT_MS",
    "ReportedProperties",
    "TimedFedAvg",
    "TracedSites",
    "profile_from_properties",
    "properties_reply",
    "query_properties",
    "recipe_from_config",
    "recipe_to_config",
    "register_property_query",
    "site_properties",
]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)

if TYPE_CHECKING:
    from powertrip.integrations.flower.client import properties_reply, register_property_query
    from powertrip.integrations.flower.profiles import (
        PROPERTY_QUERY_TIMEOUT_S,
        NodeProfiles,
        ReportedProperties,
        TracedSites,
        query_properties,
    )
    from powertrip.integrations.flower.recipe import (
        RECIPE_PREFIX,
        recipe_from_config,
        recipe_to_config,
    )
    from powertrip.integrations.flower.site_info import (
        BANDWIDTH_MBPS,
        DISTANCE_MI,
        POWER_FRACTION,
        RTT_MS,
        MissingNodeProperty,
        NodeIndex,
        profile_from_properties,
        site_properties,
    )
    from powertrip.integrations.flower.strategy import DEFAULT_POLICY, PowerTripStrategy
    from powertrip.integrations.flower.timed import TimedFedAvg
