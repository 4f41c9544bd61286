"""The sites' local optimizer on the command line (``powertrip experiment``, ``curtail`` and
``up``): one flag per ``LocalOptimizer`` field (``model_options``), folded into one validated
``local_optimizer`` before the run's configuration is built. Only the flags given are set, so
the preset's or the workload's recipe keeps the rest (``presets.layered_recipe``); no flag
given: no recipe of the command's own.

``--local-clip-norm`` clips each site's gradient; ``--clip-norm`` was already the robust
aggregation's per-update clip (an ``ExperimentConfig`` field).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from powertrip.config.optimizers import optimizer_entry, optimizer_names
from powertrip.config.recipe import LocalOptimizer
from powertrip.services.cli.common import RegisteredName, describe_validation, fail
from powertrip.services.cli.model_options import default_text, flag_for, model_options

__all__ = [
    "OPTIMIZER_CLI_LESS",
    "OPTIMIZER_FLAGS",
    "local_optimizer",
    "optimizer_options",
    "option_name",
]

#: ``LocalOptimizer`` fields whose flag is not ``--`` + the name with dashes; keep_state is a
#: pair, so both ways can be said (``--reset-optimizer-state`` is the one users type today).
OPTIMIZER_FLAGS = {
    "name": "--optimizer",
    "schedule": "--lr-schedule",
    "clip_norm": "--local-clip-norm",
    "keep_state": "--keep-optimizer-state/--reset-optimizer-state",
}

#: ``LocalOptimizer`` fields with no flag of their own, and why.
OPTIMIZER_CLI_LESS = {
    "lr": "the run's --lr: a recipe with no lr of its own trains at the run's (with_lr)",
}

FIELDS = [n for n in LocalOptimizer.model_fields if n not in OPTIMIZER_CLI_LESS]
#: how a validation error names each field: the flag the user typed
FLAG_FOR_FIELD = {n: flag_for(n, OPTIMIZER_FLAGS).split("/")[-1] for n in FIELDS}


def option_name(field: str) -> str:
    """The parameter a field's flag fills: the flag's name (``--lr-schedule`` ->
    ``lr_schedule``), apart from the run's own fields (``clip_norm``, ``lr``)."""
    return flag_for(field, OPTIMIZER_FLAGS).split("/")[0].removeprefix("--").replace("-", "_")


def _recipe_default(name: str) -> str:
    """Unset, a flag keeps the preset's or the workload's recipe (lm: the measured AdamW);
    with none, or another optimizer named, the field's own default holds."""
    own = default_text(LocalOptimizer.model_fields[name])
    return f"the recipe's, else {own}"


#: said once, on the first flag: what "the recipe's" is
_RECIPE = (
    " A flag not given keeps the recipe's value: the preset's or the workload's recipe (lm: "
    "its measured AdamW), if either has one."
)


_decorate = model_options(
    LocalOptimizer,
    FIELDS,
    OPTIMIZER_FLAGS,
    {"name": RegisteredName(optimizer_names, optimizer_entry)},
    default=_recipe_default,
    dest=option_name,
    helps={"name": f"{LocalOptimizer.model_fields['name'].description}{_RECIPE}"},
)


def local_optimizer(options: dict[str, object]) -> LocalOptimizer | None:
    """Pop the optimizer flags from ``options``: one validated recipe of the fields given (its
    ``model_fields_set``, which the layering over a preset's recipe reads), or None when none
    was given. A bad value ends the command with a one-line error naming the flag."""
    given = {n: options.pop(option_name(n), None) for n in FIELDS}
    fields = {n: v for n, v in given.items() if v is not None}
    if not fields:
        return None
    try:
        return LocalOptimizer.model_validate(fields)
    except ValidationError as exc:
        fail(describe_validation(exc, "local optimizer", FLAG_FOR_FIELD))


def optimizer_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The local optimizer flags; the command receives ``local_optimizer`` (set only when a
    flag was given, so an unset recipe stays out of the configuration)."""

    @functools.wraps(command)
    def wrapped(**options: object) -> object:
        recipe = local_optimizer(options)
        if recipe is not None:
            options["local_optimizer"] = recipe
        return command(**options)

    return _decorate(wrapped)
