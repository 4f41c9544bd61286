"""What settings share: a value left out of a dumped configuration while it equals its default
(so the summaries of runs that never set it read as they did before the setting existed), and
the finite numbers most settings are (a weight, a time, a rate)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

__all__ = ["NonNegativeFinite", "PositiveFinite", "omitted_at_default"]

#: a finite number >= 0 (a weight, a delay, a size)
NonNegativeFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]
#: a finite number > 0 (a rate, a length of time)
PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]


def omitted_at_default(default: Any, description: str | None = None, **constraints: Any) -> Any:
    """A pydantic ``Field(default, description=..., **constraints)`` (``gt``, ``ge``,
    ``allow_inf_nan``, ``pattern`` ...) that a dump leaves out while its value equals
    ``default``."""
    return Field(default, exclude_if=lambda v: v == default, description=description, **constraints)
