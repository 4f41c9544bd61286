"""Named model sizes: a table of frozen shapes, picked by name, any field overridable. The
transformer workloads (``gpt``, ``kwt``) scale from a CPU-sized default up to GPU sizes this
way, so a configuration names a size and optionally a few fields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

S = TypeVar("S", bound="DataclassInstance")


def named_shape(sizes: Mapping[str, S], size: str | None, what: str, **overrides: Any) -> S:
    """``sizes[size]`` (the first entry when None) with the non-None ``overrides`` on top."""
    name = size or next(iter(sizes))
    if name not in sizes:
        raise ValueError(f"unknown {what} size {name!r}; known sizes: {', '.join(sizes)}")
    return replace(sizes[name], **{k: v for k, v in overrides.items() if v is not None})
