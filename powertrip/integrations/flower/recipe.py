"""The local optimizer recipe in a Flower ``ConfigRecord``: the server sends it, each node
rebuilds the same validated ``LocalOptimizer``.

A ConfigRecord holds only scalars and lists of scalars, so the recipe travels flat, one key per
field under ``local-optimizer.`` (``local-optimizer.betas``: a list of two floats). Every set
field is sent, defaults included: a node then trains the recipe the server validated even if
its PowerTrip has other defaults. Unset fields (``lr``, ``total_steps``, ``clip_norm`` left
None) are left out, as a ConfigRecord has no None; ``lr`` left out means the node's own lr.
The node validates strictly (no string-to-number coercion) and refuses unknown keys, so a typo
or a newer server's field fails loudly instead of training another recipe.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from pydantic import ValidationError

from powertrip.config.recipe import LocalOptimizer

__all__ = ["RECIPE_PREFIX", "add_recipe", "recipe_from_config", "recipe_to_config"]

#: every key of the recipe in a ConfigRecord starts with this
RECIPE_PREFIX = "local-optimizer."

Scalar = bool | int | float | str | list[float]


def recipe_to_config(recipe: LocalOptimizer) -> dict[str, Scalar]:
    """The recipe as flat ConfigRecord entries (``ConfigRecord(recipe_to_config(r))``)."""
    out: dict[str, Scalar] = {}
    for field, value in recipe.model_dump().items():
        if value is None:
            continue
        if isinstance(value, tuple):  # betas: a homogeneous list, as ConfigRecord wants
            value = [float(v) for v in value]
        out[RECIPE_PREFIX + field] = value
    return out


def add_recipe(config: MutableMapping[str, Any], recipe: LocalOptimizer) -> None:
    """Put ``recipe`` into a train ConfigRecord, refusing another recipe already there (two
    recipes mixed key by key would train neither)."""
    flat = recipe_to_config(recipe)
    there = {k: v for k, v in config.items() if k.startswith(RECIPE_PREFIX)}
    if there and there != flat:
        raise ValueError(
            "train_config carries its own local-optimizer.* keys and the strategy has a "
            "local_optimizer: give the recipe once"
        )
    config.update(flat)


def recipe_from_config(config: Mapping[str, Any]) -> LocalOptimizer | None:
    """The recipe a ConfigRecord (or any mapping) carries; None when it carries none.

    Raises ValueError naming the key on an unknown ``local-optimizer.*`` key or a bad value.
    """
    fields: dict[str, Any] = {}
    for key, value in config.items():
        if not key.startswith(RECIPE_PREFIX):
            continue
        field = key.removeprefix(RECIPE_PREFIX)
        if field not in LocalOptimizer.model_fields:
            known = ", ".join(RECIPE_PREFIX + f for f in LocalOptimizer.model_fields)
            raise ValueError(f"{key}: unknown local optimizer setting (known: {known})")
        if isinstance(value, list):  # betas come back as a list
            value = tuple(value)
        fields[field] = value
    if not fields:
        return None
    try:
        return LocalOptimizer.model_validate(fields, strict=True)
    except ValidationError as exc:
        raise ValueError(_explain(exc)) from None


def _explain(exc: ValidationError) -> str:
    """Each pydantic error as ``<key>: <message>``. A cross-field check has no location; its
    message starts with the field it is about (``betas must ...``), which names the key."""
    lines = []
    for err in exc.errors():
        loc, msg = err["loc"], str(err["msg"]).removeprefix("Value error, ")
        field = str(loc[0]) if loc else msg.split(" ", 1)[0]
        key = RECIPE_PREFIX + field if field in LocalOptimizer.model_fields else "local-optimizer"
        key += "".join(f"[{i}]" for i in loc[1:])  # betas[1]: the list's second item
        lines.append(f"{key}: {msg}")
    return "; ".join(lines)
