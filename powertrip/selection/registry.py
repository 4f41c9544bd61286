"""Policy names -> configured policies: the one place the CLI, the emulator, the curtailment
study and the services turn a name like ``powertrip`` or ``static-40`` into a
``SelectionPolicy``.

Each policy module registers its own names when imported (``register_policy``); importing this
module imports every built-in one, so the names below are complete whenever they are asked for.
A user's policy registers the same way from the user's code and is then run by name::

    from powertrip.selection.registry import register_policy

    register_policy("mine", lambda name, ctx: MyPolicy(ctx.k_star))  # a SelectionPolicy
    pt.run_study(pt.build_config("quick", policies=("powertrip", "mine")))

Listing names is cheap: the selection package needs numpy only (no torch).
"""

from __future__ import annotations

# Every built-in policy module, imported for the names it registers (in the order they load).
from powertrip.selection import (
    base,
    carbon_greedy,
    ecolearn,
    fedzero,
    forecast_greedy,
    greedy,
    joint,
    oort,
)
from powertrip.selection.base import SelectionPolicy
from powertrip.selection.registration import (
    PolicyContext,
    PolicyFactory,
    PolicyMode,
    WallClockTimer,
    find_factory,
    register_policy,
    registered_names,
    unregister_policy,
)

__all__ = [
    "BUILT_IN_MODULES",
    "PolicyContext",
    "PolicyFactory",
    "PolicyMode",
    "WallClockTimer",
    "build_policy",
    "known_policy_names",
    "register_policy",
    "unregister_policy",
    "validate_policy_name",
]

BUILT_IN_MODULES = (base, greedy, forecast_greedy, joint, oort, ecolearn, fedzero, carbon_greedy)


def known_policy_names(mode: PolicyMode | str = PolicyMode.ROUNDS) -> list[str]:
    """Every name a run of ``mode`` can build, patterns as written (``static-<k>``)."""
    return registered_names(PolicyMode(mode))


def validate_policy_name(name: str, mode: PolicyMode | str = PolicyMode.ROUNDS) -> str:
    """``name`` if a policy answers to it in ``mode``; else a ValueError listing the names."""
    if find_factory(name, PolicyMode(mode)) is None:
        known = ", ".join(known_policy_names(mode))
        raise ValueError(f"unknown policy {name!r}; known policies: {known}")
    return name


def build_policy(name: str, context: PolicyContext | None = None) -> SelectionPolicy:
    """A fresh policy instance (policies keep per-run state, so never share one across runs),
    built by the factory registered for ``name`` in the context's mode (rounds by default)."""
    context = context or PolicyContext()
    factory = find_factory(validate_policy_name(name, context.mode), context.mode)
    assert factory is not None  # validated just above
    policy = factory(name, context)
    if not isinstance(policy, SelectionPolicy):
        raise TypeError(
            f"policy {name!r}: its factory returned a {type(policy).__name__}, "
            "not a SelectionPolicy"
        )
    return policy
