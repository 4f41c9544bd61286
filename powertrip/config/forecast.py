"""The spare-power forecast a study hands its policies, and how a round meets changing power
(``powertrip.sites.forecast`` implements them)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

ForecastModel = Literal["none", "persistence", "ewma", "oracle"]


#: how power moves during a round: frozen at its start (the paper's emulation) or followed
RoundPower = Literal["start", "integrated"]


class ForecastSettings(BaseModel):
    """The forecast a study hands its policies and how rounds meet changing power
    (``ExperimentConfig`` inherits them); left out of dumps while at their defaults, so existing
    summaries do not change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    forecast: ForecastModel = Field(
        "none",
        exclude_if=lambda v: v == "none",
        description="Spare-power forecast handed to the policies (powertrip-forecast uses it): "
        "none, persistence, ewma (AR(1) reversion to an EW mean) or oracle (the true future).",
    )
    forecast_error: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        exclude_if=lambda v: v == 0,
        description="oracle forecast: std of its multiplicative Gaussian error, e.g. 0.1.",
    )
    round_power: RoundPower = Field(
        "start",
        exclude_if=lambda v: v == "start",
        description="Power a round computes at: each site's at the round's start (the paper's) "
        "or integrated as it changes during the round.",
    )

    @model_validator(mode="after")
    def _error_needs_oracle(self) -> Self:
        if self.forecast_error and self.forecast != "oracle":
            raise ValueError("--forecast-error applies to --forecast oracle only")
        return self
