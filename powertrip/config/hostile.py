"""The hostile-site option of a robustness study (``powertrip.rounds.hostile`` sends the poison)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from powertrip.config.fields import PositiveFinite, omitted_at_default

Attack = Literal["huge", "scaled"]


class HostileSettings(BaseModel):
    """The hostile-site option of the PowerTrip study (``ExperimentConfig`` inherits it); left
    out of dumps while off, so other summaries do not change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hostile_fraction: float = omitted_at_default(
        0.0,
        "Share of the sites that send poisoned updates every round they train, "
        "spread evenly (0.125: one of 8); 0 for none.",
        ge=0,
        lt=0.5,
    )
    hostile_attack: Attack = omitted_at_default(
        "huge",
        "What a hostile site sends: huge (every value 1e30) or scaled (its honest "
        "update times --hostile-scale).",
    )
    hostile_scale: PositiveFinite = omitted_at_default(
        10.0, "scaled: the factor on a hostile site's honest update (10)."
    )
