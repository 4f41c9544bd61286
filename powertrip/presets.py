"""How a study's configuration is layered: a named preset, then the caller's overrides."""

from __future__ import annotations

from collections.abc import Mapping

from powertrip.learning.local_optim import LocalOptimizer

__all__ = ["layered_recipe", "preset_values"]


def preset_values(
    presets: Mapping[str, Mapping[str, object]], preset: str | None, overrides: Mapping[str, object]
) -> dict[str, object]:
    """The one way both study modes merge a preset and overrides: the preset's values (named
    after it), then the caller's non-None overrides on top; a local optimizer recipe given over
    a preset's is layered on it (``layered_recipe``)."""
    values: dict[str, object] = {}
    if preset is not None:
        if preset not in presets:
            raise ValueError(f"unknown preset {preset!r}; known presets: {', '.join(presets)}")
        values.update(presets[preset], name=preset)
    given = {k: v for k, v in overrides.items() if v is not None}
    if "local_optimizer" in given and values.get("local_optimizer") is not None:
        given["local_optimizer"] = layered_recipe(
            values["local_optimizer"], given["local_optimizer"]
        )
    values.update(given)
    return values


def layered_recipe(
    base: LocalOptimizer | Mapping[str, object], given: LocalOptimizer | Mapping[str, object]
) -> LocalOptimizer:
    """``given`` over a preset's recipe ``base``: the fields the caller set replace the
    preset's, so ``--reset-optimizer-state`` alone keeps the preset's AdamW; naming another
    optimizer starts from that optimizer's defaults (an SGD run inherits no AdamW betas or
    weight decay)."""
    base = LocalOptimizer.model_validate(base)
    given = LocalOptimizer.model_validate(given)
    if given.name != base.name and "name" in given.model_fields_set:
        return given
    fields = given.model_dump(include=given.model_fields_set)
    return LocalOptimizer(**{**base.model_dump(exclude_unset=True), **fields})
