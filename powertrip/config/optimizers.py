"""The names a local optimizer recipe may give (``LocalOptimizer.name``), readable without torch.

A name stands for a rule (``powertrip.learning.optimizers``: its moments, its batched update
over stacked sites and its ``torch.optim`` optimizer for the rank engine). The settings only
need to know which names exist and three facts the run's bookkeeping reads before any torch is
loaded, so a built-in rule is listed here as ``"module:attr"``, imported on first use; a user's
own rule is added with ``register_optimizer`` (before the recipe naming it is validated, in
every process that trains it: a worker imports the module that registers it, as it does for a
custom workload).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OptimizerEntry", "optimizer_entry", "optimizer_names", "register_optimizer"]


@dataclass(frozen=True)
class OptimizerEntry:
    """A registered optimizer: where its rule is, and what the bookkeeping needs to know."""

    #: the rule (``powertrip.learning.optimizers.OptimizerRule``) or ``"module:attr"`` naming it
    rule: object
    #: whether it keeps moments (False: a site's state is only its step count)
    moments: bool = True
    #: whether its update at a constant lr, without decay or clipping, is exactly
    #: ``p -= lr * g`` (the engines then step in the graph, with no optimizer state at all)
    plain: bool = False
    #: whether its lr is on AdamW's scale, not SGD's (a run naming no lr takes AdamW's default)
    adaptive_lr: bool = False


_RULES = "powertrip.learning.optimizers"
_ENTRIES: dict[str, OptimizerEntry] = {
    "sgd": OptimizerEntry(f"{_RULES}.sgd:SGD", moments=False, plain=True),
    "momentum": OptimizerEntry(f"{_RULES}.sgd:MOMENTUM_SGD"),
    "nesterov": OptimizerEntry(f"{_RULES}.sgd:NESTEROV"),
    "adamw": OptimizerEntry(f"{_RULES}.adamw:ADAMW", adaptive_lr=True),
    "muon": OptimizerEntry(f"{_RULES}.muon:MUON", adaptive_lr=True),
}


def optimizer_names() -> tuple[str, ...]:
    """Every registered name, built-ins first."""
    return tuple(_ENTRIES)


def optimizer_entry(name: str) -> OptimizerEntry:
    """The entry of ``name``; an unknown name is refused listing the registered ones."""
    entry = _ENTRIES.get(name)
    if entry is None:
        raise ValueError(
            f"unknown optimizer {name!r}; registered: {', '.join(optimizer_names())} "
            "(register_optimizer adds one)"
        )
    return entry


def register_optimizer(
    name: str,
    rule: object,
    *,
    moments: bool = True,
    plain: bool = False,
    adaptive_lr: bool = False,
    replace: bool = False,
) -> None:
    """Make ``name`` a valid ``LocalOptimizer.name`` trained by ``rule`` (an
    ``OptimizerRule`` or ``"module:attr"`` naming one). A taken name is refused unless
    ``replace``: two rules under one name would train different runs from one configuration."""
    if not name or not name.isidentifier():
        raise ValueError(f"optimizer name {name!r} must be a Python identifier")
    if isinstance(rule, str) and rule.count(":") != 1:
        raise ValueError(f"optimizer {name!r}: rule {rule!r} must be 'module:attr'")
    if name in _ENTRIES and not replace:
        raise ValueError(f"optimizer {name!r} is already registered (replace=True replaces it)")
    _ENTRIES[name] = OptimizerEntry(rule, moments, plain, adaptive_lr)
