"""The optional DiLoCo outer step's settings, named alike in both study modes
(``powertrip.aggregation.outer_step`` applies them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from powertrip.config.fields import PositiveFinite, omitted_at_default

#: what ``outer`` accepts in either mode's configuration
OuterRule = Literal["fedavg", "nesterov"]


class OuterSettings(BaseModel):
    """The outer step's settings, named alike in both modes' configurations (``ExperimentConfig``
    inherits them); left out of dumps while at their defaults, so FedAvg summaries are as before."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    outer: OuterRule = omitted_at_default(
        "fedavg", "After FedAvg: nothing, or the DiLoCo outer step (Nesterov SGD on the average)."
    )
    outer_lr: PositiveFinite = omitted_at_default(0.7, "Outer step's learning rate (0.7).")
    outer_momentum: float = omitted_at_default(0.9, "Outer step's momentum (0.9).", ge=0, lt=1)
