"""The spare-power forecast a study hands its policies, and how a round meets changing power
(``powertrip.sites.forecast`` implements them)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, model_validator

from powertrip.config.fields import NonNegativeFinite, omitted_at_default

ForecastModel = Literal["none", "persistence", "ewma", "oracle"]


#: how power moves during a round: frozen at its start (the paper's emulation) or followed
RoundPower = Literal["start", "integrated"]


class ForecastSettings(BaseModel):
    """The forecast a study hands its policies and how rounds meet changing power
    (``ExperimentConfig`` inherits them); left out of dumps while at their defaults, so existing
    summaries do not change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    forecast: ForecastModel = omitted_at_default(
        "none",
        "Spare-power forecast handed to the policies (powertrip-forecast uses it): "
        "none, persistence, ewma (AR(1) reversion to an EW mean) or oracle (the true future).",
    )
    forecast_error: NonNegativeFinite = omitted_at_default(
        0.0, "oracle forecast: std of its multiplicative Gaussian error, e.g. 0.1."
    )
    round_power: RoundPower = omitted_at_default(
        "start",
        "Power a round computes at: each site's at the round's start (the paper's) "
        "or integrated as it changes during the round.",
    )

    @model_validator(mode="after")
    def _error_needs_oracle(self) -> Self:
        if self.forecast_error and self.forecast != "oracle":
            raise ValueError("--forecast-error applies to --forecast oracle only")
        return self
