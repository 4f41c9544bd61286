"""Hostile sites for robustness studies: authenticated sites that send poisoned updates.

A study run with ``hostile_fraction`` > 0 (``powertrip experiment --hostile-fraction 0.125``)
marks that share of its sites hostile, spread evenly over the site indices, and replaces every
update such a site sends, as the aggregator would receive it:

- ``huge``: every value ``1e30``, finite, so no finiteness check stops it (reliability row R33);
- ``scaled``: its honest update times ``hostile_scale`` (10 by default): the subtle attack, a
  plausible direction with a norm an order of magnitude too long.

The default aggregation (``powertrip.aggregation.robust``, ``robust``) drops the first and clips
the second;
``--aggregation fedavg`` shows what they do to a plain mean (docs/robust-aggregation.md).
"""

from __future__ import annotations

import math

import numpy as np

from powertrip.config.hostile import Attack
from powertrip.learning.params import NumpyParams

#: the value every coordinate of a ``huge`` update takes
HUGE = 1e30


def hostile_sites(num_sites: int, fraction: float) -> frozenset[int]:
    """``floor(num_sites * fraction)`` sites spread evenly over the indices: site i is hostile
    when ``floor((i + 1) * fraction)`` steps up (one of 8 for 0.125: sites 7, 15, 23, ...)."""
    return frozenset(
        i for i in range(num_sites) if math.floor((i + 1) * fraction) > math.floor(i * fraction)
    )


def poison(update: NumpyParams, attack: Attack, scale: float) -> NumpyParams:
    """What a hostile site sends in place of its honest ``update`` (new arrays)."""
    if attack == "huge":
        return {name: np.full_like(a, HUGE) for name, a in update.items()}
    return {name: a * a.dtype.type(scale) for name, a in update.items()}
