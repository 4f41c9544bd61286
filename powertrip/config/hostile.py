"""The hostile-site option of a robustness study (``powertrip.rounds.hostile`` sends the poison)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Attack = Literal["huge", "scaled"]


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
