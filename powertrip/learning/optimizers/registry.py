"""Names to rules: the registered optimizers (``powertrip.config.optimizers``) resolved to their
``OptimizerRule`` on first use, and the catalogue of moment kinds a saved state is read by."""

from __future__ import annotations

import importlib
from functools import cache

from powertrip.config.optimizers import optimizer_entry, optimizer_names
from powertrip.config.recipe import LocalOptimizer
from powertrip.learning.optimizers.base import MomentKind, OptimizerRule

__all__ = ["moment_kind", "moment_kinds", "rule_for"]


def rule_for(recipe: LocalOptimizer | str) -> OptimizerRule:
    """The rule a recipe (or an optimizer name) trains with."""
    name = recipe if isinstance(recipe, str) else recipe.name
    target = optimizer_entry(name).rule
    return _resolved(target) if isinstance(target, str) else _checked(name, target)


@cache
def _resolved(target: str) -> OptimizerRule:
    module, _, attr = target.partition(":")
    return _checked(target, getattr(importlib.import_module(module), attr))


def _checked(name: str, rule: object) -> OptimizerRule:
    if not isinstance(rule, OptimizerRule):
        raise TypeError(f"optimizer {name!r}: {rule!r} is not an OptimizerRule")
    return rule


def moment_kinds() -> dict[str, MomentKind]:
    """Every kind of moment some registered rule keeps, by name (a saved state holding another
    is not a state of this library's optimizers). Two rules may share a kind only as one
    definition: a name means one torch key and one soundness rule wherever it is read."""
    kinds: dict[str, MomentKind] = {}
    for name in optimizer_names():
        for kind in rule_for(name).kinds:
            seen = kinds.setdefault(kind.name, kind)
            if seen != kind:
                raise ValueError(
                    f"optimizer {name!r} defines moment {kind.name!r} unlike another rule "
                    f"({kind} vs {seen})"
                )
    return kinds


def moment_kind(name: str) -> MomentKind | None:
    """The registered kind called ``name`` (None: no rule keeps it)."""
    return moment_kinds().get(name)
