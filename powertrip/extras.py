"""Optional dependencies: what a feature needs beyond the lean core install, and the one error a
user sees when it is missing (naming the extra that installs it)."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, extra: str, feature: str) -> ModuleType:
    """``module`` imported, or an ImportError saying which ``pip install 'powertrip[extra]'``
    brings it, so a heavy dependency only one feature needs stays out of the base install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{feature} needs {module.split('.')[0]}, which is not installed: "
            f"pip install 'powertrip[{extra}]'"
        ) from exc
