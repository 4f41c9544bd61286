"""The open optimizer registry: one rule per optimizer (its moments, its batched update over
stacked sites, its ``torch.optim`` optimizer for the rank engine), found by the recipe's name.

Built-ins: one module per rule here (sgd.py holds ``sgd``, ``momentum`` and ``nesterov``), each
listed by name in ``powertrip.config.optimizers``. A user's own rule subclasses
``OptimizerRule`` and is registered by name::

    from powertrip.learning.optimizers import OptimizerRule, register_optimizer
    register_optimizer("lion", Lion())  # or "my_package.lion:LION", imported on first use

after which ``LocalOptimizer(name="lion")`` validates and every engine trains with it. The
names are kept torch-free in ``powertrip.config.optimizers`` (the recipe validates against
them without loading torch); this package resolves them to rules.
"""

from __future__ import annotations

from powertrip.config.optimizers import optimizer_names, register_optimizer
from powertrip.learning.optimizers.base import MomentKind, OptimizerRule, RowStep
from powertrip.learning.optimizers.registry import moment_kind, moment_kinds, rule_for

__all__ = [
    "MomentKind",
    "OptimizerRule",
    "RowStep",
    "moment_kind",
    "moment_kinds",
    "optimizer_names",
    "register_optimizer",
    "rule_for",
]
