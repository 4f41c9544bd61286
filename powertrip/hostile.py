"""Hostile sites for robustness studies: authenticated sites that send poisoned updates.

A study run with ``hostile_fraction`` > 0 (``powertrip experiment --hostile-fraction 0.125``)
marks that share of its sites hostile, spread evenly over the site indices, and replaces every
update such a site sends, as the aggregator would receive it:

- ``huge``: every value ``1e30``, finite, so no finiteness check stops it (reliability row R33);
- ``scaled``: its honest update times ``hostile_scale`` (10 by default): the subtle attack, a
  plausible direction with a norm an order of magnitude too long.

The default aggregation (``powertrip.robust``, ``robust``) drops the first and clips the second;
``--aggregation fedavg`` shows what they do to a plain mean (docs/robust-aggregation.md).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from powertrip.fold_inputs import NumpyParams

Attack = Literal["huge", "scaled"]
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


class HostileSettings(BaseModel):
    """The hostile-site option of the PowerTrip study (``ExperimentConfig`` inherits it); left
    out of dumps while off, so other summaries do not change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hostile_fraction: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        exclude_if=lambda v: v == 0,
        description="Share of the sites that send poisoned updates every round they train, "
        "spread evenly (0.125: one of 8); 0 for none.",
    )
    hostile_attack: Attack = Field(
        "huge",
        exclude_if=lambda v: v == "huge",
        description="What a hostile site sends: huge (every value 1e30) or scaled (its honest "
        "update times --hostile-scale).",
    )
    hostile_scale: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        exclude_if=lambda v: v == 10.0,
        description="scaled: the factor on a hostile site's honest update (10).",
    )

    def hostile_sites(self, num_sites: int) -> frozenset[int]:
        return hostile_sites(num_sites, self.hostile_fraction)
