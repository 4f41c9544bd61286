"""Streaming FedAvg (Eq. 2): fold each site's update into a running weighted sum.

Memory is one accumulator the size of the model, whatever the number of sites: updates are
validated and added as they arrive and never kept. Works on numpy arrays (the wire format), so
the aggregator does not need torch.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from powertrip.aggregation.fold_inputs import (
    NORM_BLOCK,
    Floats,
    UpdateFold,
    UpdateRejected,
    check_weight,
    delta_sketch,
    rows_well_formed,
    sketch_stride,
    sq_norm,
    validate_update,
)
from powertrip.aggregation.fold_rows import dense_direction, row_sq_norms, shared_matrix
from powertrip.learning.params import NumpyParams

__all__ = [  # the rules and, for callers' convenience, what an update is checked against
    "FOLD_BLOCK",
    "NumpyParams",
    "StreamingFedAvg",
    "UpdateFold",
    "UpdateRejected",
    "delta_sketch",
    "sketch_stride",
]

#: elements per block of the fold's multiply-add: the ``weight * delta`` temporary stays in cache
#: (1 MiB of float32); the norm's blocks, so a norm measured while folding equals validation's.
FOLD_BLOCK = NORM_BLOCK


def _add_scaled(acc: NDArray, a: NDArray, weight: float, norm: bool = True) -> float:
    """``acc += weight * a`` block by block, returning ``a``'s squared norm (0.0 unless
    ``norm``): the same element-wise operations (bit for bit), about twice the bandwidth on a
    large tensor, and the norm's dot product reads each block while it is still in cache
    instead of a second pass over the update (benchmarks/run.py, fold section)."""
    if a.size <= FOLD_BLOCK:
        acc += weight * a
        return sq_norm(a) if norm else 0.0
    scratch = np.empty(FOLD_BLOCK, dtype=np.result_type(a.dtype, weight))
    sq = 0.0
    for i in range(0, a.size, FOLD_BLOCK):
        j = min(i + FOLD_BLOCK, a.size)
        block = scratch[: j - i]
        np.multiply(a[i:j], weight, out=block)
        acc[i:j] += block
        if norm:
            sq += sq_norm(a[i:j])
    return sq


def _running(start: float, terms: NDArray[np.float64]) -> float:
    """``start + terms[0] + terms[1] + ...`` added left to right (``np.cumsum`` accumulates in
    order), the bits a Python loop over the terms gives."""
    if terms.size == 1:
        return float(start + terms[0])
    return float(np.cumsum(np.concatenate(([start], terms)))[-1])


class StreamingFedAvg(UpdateFold):
    """Sample-weighted mean of deltas, w_{t+1} = w_t + sum_i (n_i / sum_j n_j) * delta_i.

    Also tracks the weighted mean squared norm of the deltas, so the dispersion of the round's
    updates (the noise-scale gain model's input) costs no extra memory. Given a ``direction``
    (``delta_sketch`` of the previous round's global delta), it also folds each update's
    projection on that unit direction, p_i = d_i . u, as two scalars (weighted sums of p_i and
    p_i^2): the dispersion along the direction the model is moving, for the directional noise
    scale. Models above ``SKETCH_MAX`` coordinates project on a strided sample of them.
    """

    def __init__(
        self,
        template: NumpyParams,
        accumulate_dtype: type[np.floating] | None = None,
        direction: NumpyParams | None = None,
    ):
        super().__init__(template, direction)
        self._sum = {
            name: np.zeros(shape, dtype=accumulate_dtype or dtype)
            for name, (shape, dtype) in self._spec.items()
        }
        self._sum_sq_weights = 0.0
        #: tensors a ``scale`` never shrinks (``powertrip.aggregation.robust_fedavg``: running
        # statistics)
        self.unscaled: frozenset[str] = frozenset()
        self._weighted_sq_norm = 0.0
        self._weighted_proj = 0.0
        self._weighted_sq_proj = 0.0
        self._dense: NDArray | None = None  # the direction over a full row, for matrix folds

    def add(self, delta: NumpyParams, weight: float) -> None:
        """``UpdateFold.add`` with the squared norm the validation computes anyway: one read of
        the update fewer (the fold is then one pass, as memcpy is)."""
        norms = validate_update(self._spec, delta, weight)
        self._fold(((name, 0, delta[name]) for name in self._spec), weight, sum(norms))

    def add_pieces(self, pieces: Iterable[tuple[str, int, NDArray]], weight: float) -> None:
        """Fold an update that arrives in slices: (tensor, first flat element, values).

        The slices must already be validated (a streamed update is checked chunk by chunk as it
        arrives) and must cover every tensor exactly once. Slicing does not change the sum: the
        fold is element-wise, so it equals ``add`` on the whole update bit for bit (the squared
        norm is summed per slice, so it may differ from ``add``'s in the last float32 bits).
        """
        self._fold(pieces, weight, None)

    def _fold(
        self,
        pieces: Iterable[tuple[str, int, NDArray]],
        weight: float,
        sq: float | None,
        scale: float = 1.0,
    ) -> None:
        """Fold ``pieces``; the update's squared norm is ``sq``, or measured as it is folded.
        ``scale`` shrinks the update's values (a norm clip, ``powertrip.aggregation.robust``) and
        not its
        weight: the sum gets ``weight * scale * delta``, the total weight ``weight``."""
        check_weight(weight)
        covered = dict.fromkeys(self._sum, 0)
        measure, sq = sq is None, sq or 0.0
        proj = 0.0
        for name, start, values in pieces:
            factor = weight if name in self.unscaled else weight * scale
            piece_sq, piece_proj = self.fold_piece(name, start, values, factor, measure)
            sq, proj = sq + piece_sq, proj + piece_proj
            covered[name] += values.size
        short = [n for n, c in covered.items() if c != self._sum[n].size]
        if short:  # a caller bug, not a bad update: the sum is already touched
            raise RuntimeError(f"update slices did not cover tensors {short} exactly once")
        self.count_update(weight, sq * scale * scale, proj * scale)

    def region(self, name: str, start: int, size: int) -> NDArray:
        """A view of the sums a fold of that piece overwrites (for an undo log)."""
        return self._sum[name].reshape(-1)[start : start + size]

    def fold_piece(
        self, name: str, start: int, values: NDArray, weight: float, norm: bool = True
    ) -> tuple[float, float]:
        """Add one validated piece into the sums: (its squared norm, 0.0 unless ``norm``; its
        unnormalised projection, 0.0 without a direction). ``count_update`` counts the update."""
        a = values.reshape(-1)
        sq = _add_scaled(self.region(name, start, a.size), a, weight, norm)
        if self._direction is None:  # no projection to measure
            return sq, 0.0
        first = -start % self.stride  # the sketched coordinates inside this piece
        sampled, lo = a[first :: self.stride], (start + first) // self.stride
        return sq, float(np.vdot(self._direction[name][lo : lo + sampled.size], sampled))

    def count_update(self, weight: float, sq: float, proj: float) -> None:
        """An update whose pieces are all folded, with the sums of ``fold_piece``'s figures."""
        self._fold_scalars([weight], [sq], [proj])

    def _fold_scalars(self, weights: Floats, sqs: Floats, projs: Floats) -> None:
        """Updates' weights, squared norms and projections into the round's statistics, one
        update after the other: each sum is a running (left-to-right) sum, so folding a round as
        rows gives the same float additions as folding its updates one at a time."""
        w = np.asarray(weights, dtype=np.float64)
        sq = np.asarray(sqs, dtype=np.float64)
        if w.shape != sq.shape or w.shape != np.shape(projs):
            raise ValueError("one squared norm and one projection per weight")
        self.total_weight = _running(self.total_weight, w)
        self._sum_sq_weights = _running(self._sum_sq_weights, w * w)
        self._weighted_sq_norm = _running(self._weighted_sq_norm, w * sq)
        if self._direction is not None:
            p = np.asarray(projs, dtype=np.float64) / self._direction_norm
            self._weighted_proj = _running(self._weighted_proj, w * p)
            self._weighted_sq_proj = _running(self._weighted_sq_proj, w * p * p)
        self.count += w.size

    def add_rows(
        self,
        stacked: NumpyParams,
        weights: Floats,
        sq_norms: NDArray | None = None,
        scales: NDArray | None = None,
    ) -> NDArray | None:
        """``add`` for every row at once: per tensor the rows' squared norms (one ``einsum``,
        also the finiteness check), the weighted sum (``weights @ rows``) and the projections
        as one product each, no loop over the sites. BLAS's reduction, not the row-by-row order:
        equal to adding each row in turn within float32 rounding (tests/unit/test_fedavg_rows.py;
        a float64 accumulator keeps the exact order, ``UpdateFold.add_rows``). Returns the rows'
        squared norms; ``sq_norms``, those of rows a fold of this template already checked (the
        emulator's split-half probe folds every other row of its round), spares reading them.
        ``scales`` (one per row, as ``_fold``'s) shrink the rows' values, not their weights."""
        if any(
            self._sum[n].dtype != np.asarray(a).dtype for n, a in stacked.items() if n in self._sum
        ):
            if scales is None:
                return super().add_rows(stacked, weights)
            for j, (weight, scale) in enumerate(zip(weights, scales, strict=True)):
                row = {name: a[j] for name, a in stacked.items()}
                norms = validate_update(self._spec, row, float(weight))
                pieces = ((name, 0, row[name]) for name in self._spec)
                self._fold(pieces, float(weight), sum(norms), float(scale))
            return None
        w = np.asarray(weights, dtype=np.float64)
        if w.size == 0:
            return np.zeros(0)
        formed = sq_norms is not None or rows_well_formed(self._spec, stacked, w)
        rows = {n: np.asarray(stacked[n]).reshape(w.size, -1) for n in self._spec} if formed else {}
        u = self._direction  # the matrix serves the norms and the projections only
        use_matrix = formed and (sq_norms is None or u is not None)
        flat = shared_matrix(stacked, list(self._spec)) if use_matrix else None
        if sq_norms is not None:
            sq = np.asarray(sq_norms, dtype=np.float64)
        elif flat is not None:  # one batched dot product over whole rows
            sq = row_sq_norms(flat)
        else:
            sq = np.zeros(w.size)
            for r in rows.values():  # the rows' squared norms, before the sum is touched
                sq += np.einsum("ij,ij->i", r, r)
        if sq_norms is None and not (formed and np.isfinite(sq).all()):
            # name the first bad row, as ``add`` would (finite rows whose squares overflow too)
            for j, weight in enumerate(w.tolist()):
                validate_update(self._spec, {n: a[j] for n, a in stacked.items()}, weight)
        proj = np.zeros(w.size)
        s = np.ones(w.size) if scales is None else np.asarray(scales, dtype=np.float64)
        folded = w if scales is None else w * s  # the multipliers of the rows' values
        for name, r in rows.items():  # per tensor: a product over the whole matrix adds the
            acc = self._sum[name].reshape(-1)  # same terms in another order (other bits)
            acc += (w if name in self.unscaled else folded).astype(r.dtype) @ r
            if u is not None and flat is None:
                sampled = r[:, :: self.stride]
                proj += sampled @ u[name][: sampled.shape[1]]
        if u is not None and flat is not None:  # one dense product over whole rows
            if self._dense is None or self._dense.dtype != flat.dtype:
                shapes = {n: s for n, (s, _) in self._spec.items()}
                self._dense = dense_direction(u, shapes, self.stride, flat.dtype)
            proj += flat @ self._dense
        self._fold_scalars(w, sq * s * s, proj * s)
        return sq

    def prefault(self) -> None:
        """Write the accumulator's pages now, not in the first fold (a fresh map costs ~0.05-0.3 s
        per 256 MiB on first write); the aggregator calls it in the background while the sites
        train. Does nothing once an update is folded (it writes zeros)."""
        if self.count == 0:
            for acc in self._sum.values():
                acc.fill(0)

    def mean_delta(self) -> dict[str, NDArray[np.floating]]:
        if self.count == 0:
            raise ValueError("no update was aggregated this round")
        return {
            name: (acc / self.total_weight).astype(self._spec[name][1], copy=False)
            for name, acc in self._sum.items()
        }

    def apply(
        self, global_params: NumpyParams, in_place: bool = False
    ) -> dict[str, NDArray[np.floating]]:
        """The new global model; refuses a non-finite result rather than poisoning the run.

        ``in_place`` builds the result in the accumulator's own buffers (same arithmetic, same
        bits), so committing a round needs no third model-sized copy; the aggregator is spent
        afterwards.
        """
        if self.count == 0:
            raise ValueError("no update was aggregated this round")
        for name, (shape, dtype) in self._spec.items():
            g = global_params.get(name)
            if g is None or g.shape != shape or g.dtype != dtype:
                raise ValueError(f"global tensor {name!r} does not match the update template")
        new: dict[str, NDArray[np.floating]] = {}
        for name, (_, dtype) in self._spec.items():
            acc = self._sum[name]
            if in_place and acc.dtype == dtype:
                np.divide(acc, self.total_weight, out=acc)
                np.add(global_params[name], acc, out=acc)
                new[name] = acc
            else:
                new[name] = global_params[name] + (acc / self.total_weight).astype(
                    dtype, copy=False
                )
            if not np.isfinite(new[name]).all():
                raise UpdateRejected("non_finite", "aggregated model is not finite; round refused")
        if in_place:
            self.count = 0  # spent: the buffers now hold the new model
        return new

    def dispersion(self) -> tuple[float, float, float]:
        """(weighted mean |delta_i|^2, |mean delta|^2, effective number of sites)."""
        if self.count == 0:
            raise ValueError("no update was aggregated this round")
        sq_of_mean = 0.0
        for name, acc in self._sum.items():  # one tensor at a time: no model-sized temporary
            m = (acc / self.total_weight).astype(self._spec[name][1], copy=False)
            sq_of_mean += float(np.vdot(m, m))
        # products, not ``**``: a float power raises OverflowError where a product gives inf
        k_eff = self.total_weight * self.total_weight / self._sum_sq_weights
        return self._weighted_sq_norm / self.total_weight, sq_of_mean, k_eff

    def projection(self) -> tuple[float, float] | None:
        """(weighted mean of d_i . u, weighted mean of (d_i . u)^2) for the unit direction u;
        None without a direction. Same weights as ``dispersion``, so its k_eff applies."""
        if self.count == 0:
            raise ValueError("no update was aggregated this round")
        if self._direction is None:
            return None
        w = self.total_weight
        return self._weighted_proj / w, self._weighted_sq_proj / w
