"""Which workload a run names, built-in or a user's: every one is a ``CustomWorkload``.

A run configuration holds a workload *name*, so it stays a plain, serialisable value that the
aggregator can send to its workers. Names resolve here, one way for the study and the services:

* a built-in name (``BUILTIN_WORKLOADS``): its declaration is listed below as
  ``"module:attribute"`` (a small module of ``powertrip.learning.workloads``), imported on
  first use the way a user's reference is;
* a name given to ``register_workload`` in this process (scripts, notebooks, tests);
* ``"package.module:attribute"``, imported on first use: the attribute is a ``CustomWorkload``
  or a function of no arguments returning one. Every service process imports it, so this is
  how the aggregator and the workers train your model (``POWERTRIP_WORKLOAD``).

The settings read a built-in workload's defaults from ``workload_defaults`` and whether it needs
a dataset path from this table, so they never import its declaration: torch-free, importing
this module costs nothing until a reference is imported (``workload_declaration``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class WorkloadSpec(Protocol):
    """What a configuration reads of a workload (``powertrip.CustomWorkload`` is the one
    implementation; the protocol keeps this module free of torch)."""

    name: str
    lr: float
    batch_size: int
    model: Any
    data: Any


__all__ = [
    "BUILTINS",
    "BUILTIN_WORKLOADS",
    "BuiltinEntry",
    "WorkloadSpec",
    "needs_dataset_path",
    "register_workload",
    "resolve_workload",
    "validate_workload",
    "workload_declaration",
]


@dataclass(frozen=True)
class BuiltinEntry:
    """A built-in workload: where it is declared, and what the settings check before loading it."""

    #: ``"module:attribute"`` of its ``CustomWorkload``
    declaration: str
    #: whether it runs without a dataset path (generated data, or lm's embedded corpus)
    generated: bool = False


_DECLARED = "powertrip.learning.workloads"
#: every built-in workload by name; its defaults are ``workload_defaults.WORKLOAD_DEFAULTS``
BUILTINS: dict[str, BuiltinEntry] = {
    "mnist1d": BuiltinEntry(f"{_DECLARED}.mnist1d:MNIST1D", generated=True),
    "mnist": BuiltinEntry(f"{_DECLARED}.idx:MNIST"),
    "emnist": BuiltinEntry(f"{_DECLARED}.idx:EMNIST"),
    "shakespeare": BuiltinEntry(f"{_DECLARED}.shakespeare:SHAKESPEARE"),
    "lm": BuiltinEntry(f"{_DECLARED}.lm:LM", generated=True),
    "speech-commands": BuiltinEntry(f"{_DECLARED}.speech:SPEECH_COMMANDS"),
    "fsdd": BuiltinEntry(f"{_DECLARED}.speech:FSDD"),
}
BUILTIN_WORKLOADS: tuple[str, ...] = tuple(BUILTINS)

_registered: dict[str, WorkloadSpec] = {}
_declared: dict[str, WorkloadSpec] = {}


def register_workload(workload: WorkloadSpec) -> str:
    """Make ``workload`` known by its name in this process; returns the name to configure."""
    if not isinstance(workload, WorkloadSpec):
        raise TypeError(f"register a powertrip.CustomWorkload, not {type(workload).__name__}")
    if workload.name in BUILTINS:
        raise ValueError(f"{workload.name!r} is a built-in workload's name; choose another")
    _registered[workload.name] = workload
    return workload.name


def resolve_workload(name: str) -> WorkloadSpec | None:
    """The user's workload ``name`` refers to; None for a built-in name (the settings read its
    defaults without loading it). ValueError, naming the name and what was wrong, for anything
    else."""
    if name in BUILTINS:
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


def workload_declaration(name: str) -> WorkloadSpec:
    """The workload ``name`` refers to, built-in or a user's; a built-in one's declaration is
    imported on first use (it loads torch)."""
    entry = BUILTINS.get(name)
    if entry is None:
        found = resolve_workload(name)
        assert found is not None
        return found
    if name not in _declared:
        declared = _import(entry.declaration)
        if declared.name != name:
            raise ValueError(
                f"built-in workload {name!r}: {entry.declaration} declares {declared.name!r}"
            )
        _declared[name] = declared
    return _declared[name]


def validate_workload(name: str) -> str:
    """``name`` if it resolves (a pydantic validator for the configurations' ``workload``)."""
    resolve_workload(name)
    return name


def needs_dataset_path(workload: str | None) -> bool:
    """Whether ``workload`` reads a user-given dataset: a built-in one that is not generated (a
    custom workload brings its data, or reads the path itself when one is given)."""
    entry = BUILTINS.get(workload or "")
    return entry is not None and not entry.generated


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
