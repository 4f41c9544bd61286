"""Which workload a run names: a built-in one, or a user's ``CustomWorkload``.

A run configuration holds a workload *name*, so it stays a plain, serialisable value that the
aggregator can send to its workers. Names resolve here, one way for the study and the services:

* a built-in name (``BUILTIN_WORKLOADS``);
* a name given to ``register_workload`` in this process (scripts, notebooks, tests);
* ``"package.module:attribute"``, imported on first use: the attribute is a ``CustomWorkload``
  or a function of no arguments returning one. Every service process imports it, so this is
  how the aggregator and the workers train your model (``POWERTRIP_WORKLOAD``).

Torch-free: importing this module costs nothing until a reference is imported.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal, Protocol, get_args, runtime_checkable


@runtime_checkable
class WorkloadSpec(Protocol):
    """What a configuration reads of a custom workload (``powertrip.CustomWorkload`` is the
    one implementation; the protocol keeps this module free of torch)."""

    name: str
    lr: float
    batch_size: int
    model: Any
    data: Any


__all__ = [
    "BUILTIN_WORKLOADS",
    "BuiltinWorkload",
    "WorkloadSpec",
    "register_workload",
    "resolve_workload",
    "validate_workload",
]

BuiltinWorkload = Literal[
    "mnist1d", "mnist", "emnist", "shakespeare", "lm", "speech-commands", "fsdd"
]
BUILTIN_WORKLOADS: tuple[str, ...] = get_args(BuiltinWorkload)

_registered: dict[str, WorkloadSpec] = {}


def register_workload(workload: WorkloadSpec) -> str:
    """Make ``workload`` known by its name in this process; returns the name to configure."""
    if not isinstance(workload, WorkloadSpec):
        raise TypeError(f"register a powertrip.CustomWorkload, not {type(workload).__name__}")
    if workload.name in BUILTIN_WORKLOADS:
        raise ValueError(f"{workload.name!r} is a built-in workload's name; choose another")
    _registered[workload.name] = workload
    return workload.name


def resolve_workload(name: str) -> WorkloadSpec | None:
    """The custom workload ``name`` refers to; None for a built-in name. ValueError, naming
    the name and what was wrong, for anything else."""
    if name in BUILTIN_WORKLOADS:
        return None
    if name in _registered:
        return _registered[name]
    if ":" not in name:
        raise ValueError(
            f"unknown workload {name!r}: built-in workloads are {', '.join(BUILTIN_WORKLOADS)}; "
            "a custom one is a name given to powertrip.register_workload or a "
            "'package.module:attribute' reference"
        )
    _registered[name] = _import(name)
    return _registered[name]


def validate_workload(name: str) -> str:
    """``name`` if it resolves (a pydantic validator for the configurations' ``workload``)."""
    resolve_workload(name)
    return name


def _import(reference: str) -> WorkloadSpec:
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"workload {reference!r}: cannot import {module_name!r} ({exc})") from None
    value: Any = getattr(module, attribute, None)
    if value is None:
        raise ValueError(f"workload {reference!r}: {module_name!r} has no {attribute!r}")
    if callable(value) and not isinstance(value, WorkloadSpec):
        value = value()
    if not isinstance(value, WorkloadSpec):
        raise ValueError(
            f"workload {reference!r}: expected a powertrip.CustomWorkload (or a function "
            f"returning one), got {type(value).__name__}"
        )
    return value
