"""Packages whose public names load on first use: ``import powertrip`` (or an integration)
stays cheap, and a name pulls in torch, Flower or matplotlib only when it is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for ``exports`` (public name -> the module
    defining it; a relative name is taken within the package). ``namespace`` is the package's
    ``globals()``: a name, once loaded, is kept there, so later lookups skip ``__getattr__``.
    The package's ``__all__`` (spelled out for static tools) must name exactly ``exports``."""
    package = namespace["__name__"]
    listed, exported = sorted(namespace["__all__"]), sorted(exports)
    if listed != exported:
        raise ImportError(f"{package}: __all__ {listed} does not match the lazy exports {exported}")

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
