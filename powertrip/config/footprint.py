"""What a study charges a round for power: a site's draw and the synthetic grid's regions and
weights (``powertrip.footprint`` prices the rounds)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from powertrip.config.fields import NonNegativeFinite, omitted_at_default

TRAIN_KW = 2.024  # a 4 x A100 site training (the paper's notebook)


IDLE_KW = 0.468  # provisioned but not training: provisioning, loading, waiting for a round
GRID_REGIONS = 5


class FootprintSettings(BaseModel):
    """The grid and node power a study prices its rounds on, and the joint policy's weights
    (``ExperimentConfig`` inherits them); left out of dumps while at their defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    train_kw: float = omitted_at_default(
        TRAIN_KW,
        "Power of a site training at full power (kW); a capped site draws its share.",
        gt=0,
    )
    idle_kw: float = omitted_at_default(
        IDLE_KW, "Power of a selected site waiting for its round to end (kW).", ge=0
    )
    grid_regions: int = omitted_at_default(
        GRID_REGIONS,
        "Synthetic grid regions (site i in region i mod R) for emissions and cost.",
        ge=1,
    )
    grid_seed: int = omitted_at_default(0, "Seed of the synthetic carbon and price series.")
    carbon_weight: NonNegativeFinite = omitted_at_default(
        0.5, "powertrip-joint: weight of emissions against round time (0: ignore carbon)."
    )
    price_weight: NonNegativeFinite = omitted_at_default(
        0.5, "powertrip-joint: weight of electricity cost against round time (0: ignore)."
    )
