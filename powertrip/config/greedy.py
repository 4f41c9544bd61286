"""Overrides of Algorithm 1's free parameters, as a study's settings (``ExperimentConfig.greedy``,
one command-line flag each)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GreedyParams(BaseModel):
    """Overrides of Algorithm 1's free parameters (k0, window, patience, ...); unset keeps the
    variant's default."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    k0: int | None = Field(None, ge=1, description="Algorithm 1: initial site count.")
    window: int | None = Field(None, ge=0, description="Algorithm 1: candidate window (0 = all).")
    patience: int | None = Field(None, ge=1, description="Algorithm 1: rounds before shrinking.")
    trend_rounds: int | None = Field(None, ge=1, description="Algorithm 1: trend rounds (m).")
    gain_floor: float | None = Field(None, gt=0, description="Algorithm 1: projected gain floor.")
    kappa: float | None = Field(None, ge=0, description="kappa-headroom gain: headroom strength.")
    round_budget: int | None = Field(
        None, ge=0, description="Grow k after this many rounds behind the target's pace (0: off)."
    )

    def overrides(self) -> dict[str, object]:
        """The set fields; an explicit k0 or window is absolute (no scaling with the sites)."""
        out = {k: v for k, v in self.model_dump().items() if v is not None}
        return out | ({"reference_sites": 0} if {"k0", "window"} & set(out) else {})
