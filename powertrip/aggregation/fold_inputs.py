"""What a fold checks and projects on: the model as numpy arrays, the validation every
aggregation rule applies to an update, and the strided sketch of the last global delta that
updates are projected on (``powertrip.aggregation.fedavg``, ``powertrip.aggregation.robust``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

from powertrip.learning.params import NumpyParams

#: per-update numbers (weights, norms): a list or a numpy vector
Floats = Sequence[float] | NDArray[np.floating]

__all__ = [
    "MAX_WEIGHT",
    "NORM_BLOCK",
    "SKETCH_MAX",
    "UpdateRejected",
    "all_finite",
    "check_weight",
    "delta_sketch",
    "rows_well_formed",
    "sketch_stride",
    "sq_norm",
    "unit_direction",
    "validate_update",
    "weight_problem",
]


#: the largest update weight any rule folds: 2**53, the largest integer float64 holds exactly
#: (a sample or step count beyond it is absurd). Bounding every weight keeps a round's scalars
#: (sum of weights, sum of squared weights, weighted squared norms) finite whatever a peer sends;
#: the aggregator service bounds a site's weight far tighter, by what it assigned the site.
MAX_WEIGHT = float(2**53)

#: values per block of a squared norm (``sq_norm``), also the fold's block (``FOLD_BLOCK``)
NORM_BLOCK = 1 << 18

#: at most this many coordinates of the direction are kept (4 MiB of float32): the projections
#: are exact below it and a strided sample above it, so a 256 MiB model's direction costs 4 MiB
SKETCH_MAX = 1 << 20


def sketch_stride(template: NumpyParams) -> int:
    """Every ``stride``-th coordinate of each flattened tensor forms the direction sketch."""
    total = sum(math.prod(np.shape(a)) for a in template.values())
    return max(1, -(-total // SKETCH_MAX))


def delta_sketch(
    new: NumpyParams, old: NumpyParams, stride: int
) -> dict[str, NDArray[np.floating]]:
    """The strided coordinates of new - old (the last global delta), without a full copy."""
    return {
        k: np.asarray(new[k]).reshape(-1)[::stride] - np.asarray(old[k]).reshape(-1)[::stride]
        for k in new
    }


class UpdateRejected(ValueError):
    """An update that must not reach the global model; ``reason`` is a bounded metric label."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def weight_problem(weight: float) -> str | None:
    """Why ``weight`` cannot weight an update (non-finite, not positive, subnormal, above
    ``MAX_WEIGHT``), or None. One rule for every fold, so all refuse alike."""
    w = float(weight)
    if not math.isfinite(w) or w <= 0:
        return f"update weight must be finite and > 0, got {weight}"
    if w < np.finfo(np.float64).tiny:
        return f"update weight {weight} is subnormal"
    if w > MAX_WEIGHT:
        return f"update weight {weight:g} is above the largest count accepted ({MAX_WEIGHT:g})"
    return None


def check_weight(weight: float) -> None:
    """UpdateRejected("bad_weight") unless ``weight`` is usable (``weight_problem``)."""
    problem = weight_problem(weight)
    if problem:
        raise UpdateRejected("bad_weight", problem)


def validate_update(
    spec: dict[str, tuple[tuple[int, ...], np.dtype]], delta: NumpyParams, weight: float
) -> list[float]:
    """Raise UpdateRejected naming the first problem with an update against the model's
    (shape, dtype) ``spec``: shared by every aggregation rule, so all refuse alike. Returns each
    tensor's squared norm in ``spec`` order: the finiteness check's own sum of squares, so a
    fold need not read the update a second time for it."""
    check_weight(weight)
    missing = spec.keys() - delta.keys()
    extra = delta.keys() - spec.keys()
    if missing or extra:
        raise UpdateRejected(
            "tensor_set",
            f"update tensors differ from the model: missing {sorted(missing)}, "
            f"unexpected {sorted(extra)}",
        )
    norms = []
    for name, (shape, dtype) in spec.items():
        a = delta[name]
        if a.shape != shape:
            raise UpdateRejected("shape", f"tensor {name!r} has shape {a.shape}, expected {shape}")
        if a.dtype != dtype:
            raise UpdateRejected("dtype", f"tensor {name!r} has dtype {a.dtype}, expected {dtype}")
        sq = sq_norm(a)
        if not all_finite(a, sq):
            raise UpdateRejected("non_finite", f"tensor {name!r} contains NaN or Inf")
        norms.append(sq)
    return norms


def unit_direction(
    spec: dict[str, tuple[tuple[int, ...], np.dtype]], direction: NumpyParams, stride: int
) -> tuple[dict[str, NDArray] | None, float]:
    """Check a ``delta_sketch`` against the model's ``spec``; (flat sketch, its norm), or
    (None, 0.0) for a zero or broken direction (no projection then)."""
    sizes = {n: -(-math.prod(shape) // stride) for n, (shape, _) in spec.items()}
    if direction.keys() != spec.keys() or any(np.size(direction[n]) != sizes[n] for n in sizes):
        raise ValueError("direction tensors must match the update template")
    norm_sq = sum(float(np.vdot(v, v)) for v in direction.values())
    if not (np.isfinite(norm_sq) and norm_sq > 0):
        return None, 0.0
    return {n: np.asarray(v).reshape(-1) for n, v in direction.items()}, float(np.sqrt(norm_sq))


def sq_norm(a: NDArray) -> float:
    """``a``'s squared norm in one read: BLAS dot products in ``a``'s precision over blocks of
    ``NORM_BLOCK`` values, summed as Python floats (one float32 dot product over 64 M values
    drifts by ~1e-3; blocked, ~4e-7)."""
    flat = a.reshape(-1)
    if flat.size <= NORM_BLOCK:
        return float(np.vdot(flat, flat))
    total = 0.0
    for i in range(0, flat.size, NORM_BLOCK):
        block = flat[i : i + NORM_BLOCK]
        total += float(np.vdot(block, block))
    return total


def all_finite(a: NDArray, sq: float | None = None) -> bool:
    """Whether every value is finite, in one read: a NaN or an infinity makes the sum of squares
    (``sq``: ``sq_norm(a)``, computed unless given) non-finite; only when that sum overflows on
    finite values is every value checked."""
    if a.dtype.kind != "f":
        return True
    return bool(np.isfinite(sq_norm(a) if sq is None else sq)) or bool(np.isfinite(a).all())


def rows_well_formed(
    spec: dict[str, tuple[tuple[int, ...], np.dtype]], stacked: NumpyParams, w: NDArray
) -> bool:
    """The checks of ``validate_update`` that read no values, for every row at once (tensor
    set, shapes, dtypes, weights); finiteness is the caller's (a fold's row norms show it)."""
    return (
        stacked.keys() == spec.keys()
        # ``weight_problem`` for every weight at once (finite, > 0, normal, <= MAX_WEIGHT)
        and bool(np.all(np.isfinite(w) & (w >= np.finfo(np.float64).tiny) & (w <= MAX_WEIGHT)))
        and all(
            stacked[name].shape == (w.size, *shape) and stacked[name].dtype == dtype
            for name, (shape, dtype) in spec.items()
        )
    )


class UpdateFold:
    """What every aggregation rule shares: the model's tensor spec, the checks an update must
    pass, and the unit direction (``delta_sketch`` of the last global delta) updates project on.
    A rule implements ``add_pieces``; ``add`` is a whole, not yet validated update."""

    def __init__(self, template: NumpyParams, direction: NumpyParams | None = None) -> None:
        self._spec = {name: (a.shape, a.dtype) for name, a in template.items()}
        self.count = 0
        self.total_weight = 0.0
        self.stride = sketch_stride(template)
        self._direction: dict[str, NDArray] | None = None
        self._direction_norm = 0.0
        if direction is not None:
            self._direction, self._direction_norm = unit_direction(
                self._spec, direction, self.stride
            )

    def validate(self, delta: NumpyParams, weight: float) -> None:
        """Raise UpdateRejected naming the first problem; never touches the accumulator."""
        validate_update(self._spec, delta, weight)

    def add(self, delta: NumpyParams, weight: float) -> None:
        self.validate(delta, weight)
        self.add_pieces(((name, 0, delta[name]) for name in self._spec), weight)

    def add_rows(
        self, stacked: NumpyParams, weights: Floats, sq_norms: NDArray | None = None
    ) -> NDArray | None:
        """Fold a batched round: row j of every tensor in ``stacked`` ([k, *shape]) is one
        update of weight ``weights[j]``, folded in row order. The same result as ``add`` on each
        row in turn, bit for bit; a rule may do it faster (``StreamingFedAvg`` does, and returns
        the rows' squared norms; ``sq_norms`` is its shortcut, unused here)."""
        for j, weight in enumerate(weights):
            self.add({name: a[j] for name, a in stacked.items()}, float(weight))
        return None

    def add_pieces(self, pieces: Iterable[tuple[str, int, NDArray]], weight: float) -> None:
        raise NotImplementedError

    def prefault(self) -> None:
        """Make the rule's buffers resident now rather than at the first fold (no-op here)."""
