"""How a setting that a study may leave at its default is declared: left out of a dumped
configuration while it equals that default, so the summaries of runs that never set it read as
they did before the setting existed."""

from __future__ import annotations

from typing import Any

from pydantic import Field

__all__ = ["omitted_at_default"]


def omitted_at_default(default: Any, description: str | None = None, **constraints: Any) -> Any:
    """A pydantic ``Field(default, description=..., **constraints)`` (``gt``, ``ge``,
    ``allow_inf_nan``, ``pattern`` ...) that a dump leaves out while its value equals
    ``default``."""
    return Field(default, exclude_if=lambda v: v == default, description=description, **constraints)
