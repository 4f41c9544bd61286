"""What a study charges a round for power: a site's draw and the synthetic grid's regions and
weights (``powertrip.footprint`` prices the rounds)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

TRAIN_KW = 2.024  # a 4 x A100 site training (the paper's notebook)


IDLE_KW = 0.468  # provisioned but not training: provisioning, loading, waiting for a round
GRID_REGIONS = 5


class FootprintSettings(BaseModel):
    """The grid and node power a study prices its rounds on, and the joint policy's weights
    (``ExperimentConfig`` inherits them); left out of dumps while at their defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    train_kw: float = Field(
        TRAIN_KW,
        gt=0,
        exclude_if=lambda v: v == TRAIN_KW,
        description="Power of a site training at full power (kW); a capped site draws its share.",
    )
    idle_kw: float = Field(
        IDLE_KW,
        ge=0,
        exclude_if=lambda v: v == IDLE_KW,
        description="Power of a selected site waiting for its round to end (kW).",
    )
    grid_regions: int = Field(
        GRID_REGIONS,
        ge=1,
        exclude_if=lambda v: v == GRID_REGIONS,
        description="Synthetic grid regions (site i in region i mod R) for emissions and cost.",
    )
    grid_seed: int = Field(
        0, exclude_if=lambda v: v == 0, description="Seed of the synthetic carbon and price series."
    )
    carbon_weight: float = Field(
        0.5,
        ge=0,
        allow_inf_nan=False,
        exclude_if=lambda v: v == 0.5,
        description="powertrip-joint: weight of emissions against round time (0: ignore carbon).",
    )
    price_weight: float = Field(
        0.5,
        ge=0,
        allow_inf_nan=False,
        exclude_if=lambda v: v == 0.5,
        description="powertrip-joint: weight of electricity cost against round time (0: ignore).",
    )
