"""Checked reading of ``state_dict()`` values (the PyTorch shape: plain dicts of numbers, lists
and numpy arrays, never pickled objects), shared by the policies, their gain models and the round
loop, so a state that does not fit its object is a TypeError or ValueError naming the field
instead of a crash rounds later.

A state comes back from a checkpoint's JSON manifest and npz: numbers may come back as ints
where floats went in (``1.0`` is written ``1.0``, but a value computed as an int stays one), and
tuples as lists. The readers here accept exactly that and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray


def fields(state: object, where: str, keys: set[str]) -> Mapping[str, Any]:
    """``state`` as a mapping with exactly ``keys``; TypeError or ValueError naming ``where``."""
    if not isinstance(state, Mapping):
        raise TypeError(f"{where} is {kind(state)}, not a mapping")
    if set(state) != keys:
        missing, extra = sorted(keys - set(state)), sorted(set(state) - keys)
        raise ValueError(
            f"{where} does not fit this object: missing {missing}, unknown {extra}"
            if missing or extra
            else f"{where} does not fit this object"
        )
    return state


def kind(value: object) -> str:
    name = type(value).__name__
    return "null" if value is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def number(value: object, where: str, optional: bool = False) -> float | None:
    """A float (ints accepted), or None when ``optional``; TypeError otherwise."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
        raise TypeError(f"{where} is {kind(value)}, not a number")
    return float(value)


def integer(value: object, where: str, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{where} is {kind(value)}, not an integer")
    return int(value)


def numbers(value: object, where: str) -> list[float]:
    return _entries(value, where, "numbers", number)


def integers(value: object, where: str) -> list[int]:
    return _entries(value, where, "integers", integer)


def _entries(value: object, where: str, what: str, read: Callable[[object, str], Any]) -> list[Any]:
    """A list (a numpy array accepted) read entry by entry with ``read`` (``number``,
    ``integer``), each entry named ``where[i]``; TypeError otherwise."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, list):
        raise TypeError(f"{where} is {kind(value)}, not a list of {what}")
    return [read(v, f"{where}[{i}]") for i, v in enumerate(value)]


def array(value: object, where: str, dtype: type) -> NDArray:
    """A 1-d numpy array of ``dtype`` (a list of numbers accepted); TypeError otherwise."""
    if isinstance(value, list):
        value = np.asarray(numbers(value, where), dtype=dtype)
    if not isinstance(value, np.ndarray) or value.ndim != 1:
        raise TypeError(f"{where} is {kind(value)}, not a 1-d array")
    if not np.can_cast(value.dtype, dtype, casting="same_kind"):
        raise TypeError(f"{where} is an array of {value.dtype}, not of {np.dtype(dtype)}")
    return value.astype(dtype, copy=True)


def pair(value: object, where: str) -> tuple[float, float] | None:
    """A (float, float) pair or None."""
    if value is None:
        return None
    got = numbers(value, where)
    if len(got) != 2:
        raise ValueError(f"{where} has {len(got)} numbers, not 2")
    return got[0], got[1]


def generator_state(rng: np.random.Generator) -> dict[str, Any]:
    """A numpy Generator's bit generator state (plain ints and strings), a copy."""
    return dict(rng.bit_generator.state)


def load_generator_state(rng: np.random.Generator, state: object, where: str) -> None:
    """Put ``state`` (``generator_state``) into ``rng``; TypeError or ValueError when it is not
    a state of that bit generator."""
    if not isinstance(state, Mapping):
        raise TypeError(f"{where} is {kind(state)}, not a random generator state")
    name = type(rng.bit_generator).__name__
    if state.get("bit_generator") != name:
        raise ValueError(f"{where} is a state of {state.get('bit_generator')!r}, not {name}")
    try:
        rng.bit_generator.state = dict(state)
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"{where} is not a {name} state: {exc}") from None
