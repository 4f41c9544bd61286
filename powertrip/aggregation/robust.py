"""Aggregation rules for rounds that may include hostile sites (reliability rows R13, R33).

Plain FedAvg (``powertrip.aggregation.fedavg``) lets one site move the global model anywhere: a
single update
of finite but huge values (every float 1e30) sets the mean. A run names its rule here
(``Aggregation``, ``make_aggregator``: the one factory the emulator, the aggregator service,
curtailment and the Flower strategy build a round's fold with):

- ``robust`` (the default): TensorFlow Federated's ``robust_aggregator`` without noise, streamed
  like FedAvg: extreme updates dropped, the rest clipped to an adaptive norm relative to the
  model's (``powertrip.aggregation.robust_fedavg``, whose docstring gives the rule and its units).
- ``fedavg``: the paper's plain mean, opt-in (``--aggregation fedavg``).
- ``trimmed-mean``: per coordinate, drop the ``k = floor(beta * n)`` largest and ``k`` smallest
  values and average the rest. Tolerates up to ``k`` hostile updates.
- ``median``: per coordinate (mean of the two middle values for even n). Tolerates
  ``ceil(n / 2) - 1`` hostile updates.
- ``clip_norm`` C: a fixed L2 clip of each update before ``trimmed-mean`` or ``median`` sees it.

The order statistics ignore the weight (``num_examples``), as Flower's FedTrimmedAvg and
FedMedian do, and hold every update at once: n model-sized updates where the streaming rules
(``fedavg``, ``robust``) hold one model-sized sum whatever n (docs/robust-aggregation.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import NDArray

from powertrip.aggregation.fedavg import StreamingFedAvg, UpdateFold, UpdateRejected
from powertrip.aggregation.fold_inputs import check_weight
from powertrip.aggregation.robust_fedavg import AdaptiveBound, RobustFedAvg
from powertrip.config.aggregation import check_settings
from powertrip.learning.params import NumpyParams

if TYPE_CHECKING:
    from powertrip.config.experiment import ExperimentConfig

Rule = Literal["robust", "fedavg", "trimmed-mean", "median"]
#: the rule a run gets unless it names one
DEFAULT_RULE: Rule = "robust"
DEFAULT_TRIM_BETA = 0.2
#: coordinates sorted at once: the working block is n x CHUNK values, never n x model
CHUNK = 1 << 16


class RobustAggregator(UpdateFold):
    """Norm clipping, then a coordinate-wise trimmed mean or median over the held updates.

    Same calls as ``StreamingFedAvg`` (``add``, ``add_pieces``, ``count``, ``mean_delta``,
    ``apply``, ``dispersion``, ``projection``). The statistics for the policies describe the
    updates the rule saw (clipped), unweighted like the rule itself.
    """

    def __init__(
        self,
        template: NumpyParams,
        rule: Literal["trimmed-mean", "median"],
        *,
        clip_norm: float | None = None,
        trim_beta: float | None = None,
        direction: NumpyParams | None = None,
    ) -> None:
        if rule == "fedavg":
            raise ValueError("RobustAggregator does not do fedavg: use make_aggregator")
        check_settings(rule, clip_norm, trim_beta)
        self.rule = rule
        self.clip_norm = clip_norm
        self.beta = DEFAULT_TRIM_BETA if trim_beta is None else float(trim_beta)
        super().__init__(template, direction)
        self._dtype = np.result_type(*(dt for _, dt in self._spec.values()))
        sizes = [int(np.prod(shape, dtype=np.int64)) for shape, _ in self._spec.values()]
        ends = np.cumsum(sizes, dtype=np.int64)
        named = zip(self._spec, sizes, ends, strict=True)
        self._slice = {n: slice(int(e) - k, int(e)) for n, k, e in named}
        self._size = int(ends[-1]) if sizes else 0
        self._updates: list[NDArray] = []  # flat, clipped, in fold order
        self._sq_norms: list[float] = []
        self._proj: list[float] = []
        self._result: NDArray | None = None
        self.clipped = 0  # updates the norm clip shrank this round

    def add_pieces(self, pieces: Iterable[tuple[str, int, NDArray]], weight: float) -> None:
        """Keep an update that arrives in already-validated slices (tensor, first element,
        values) covering every tensor once; clipped once it is whole."""
        check_weight(weight)
        if self._result is not None:
            raise RuntimeError("the round is already aggregated")
        flat = np.empty(self._size, dtype=self._dtype)
        covered = dict.fromkeys(self._spec, 0)
        for name, start, values in pieces:
            a = values.reshape(-1)
            lo = self._slice[name].start + start
            flat[lo : lo + a.size] = a
            covered[name] += a.size
        short = [n for n, c in covered.items() if c != flat[self._slice[n]].size]
        if short:
            raise RuntimeError(f"update slices did not cover tensors {short} exactly once")
        with np.errstate(over="ignore"):  # finite values whose squares overflow: redone below
            sq = float(np.dot(flat, flat))
        if not math.isfinite(sq):  # finite values whose squares overflow float32
            sq = float(np.dot(flat.astype(np.float64), flat.astype(np.float64)))
        norm = math.sqrt(sq)
        if self.clip_norm is not None and norm > self.clip_norm:
            flat *= flat.dtype.type(self.clip_norm / norm)
            sq = self.clip_norm**2
            self.clipped += 1
        if self._direction is not None:
            proj = 0.0
            for name, u in self._direction.items():
                proj += float(np.dot(u, flat[self._slice[name]][:: self.stride]))
            self._proj.append(proj / self._direction_norm)
        self._updates.append(flat)
        self._sq_norms.append(sq)
        self.total_weight += weight
        self.count += 1

    @property
    def trimmed(self) -> int:
        """Values dropped at each end per coordinate: floor(beta * n), or all but the middle
        one (odd n) or two (even n) for the median, which is that trimmed mean."""
        if self.rule == "median":
            return (self.count - 1) // 2
        return int(math.floor(self.beta * self.count))

    def _aggregate(self) -> NDArray:
        """The rule over the held updates, one sorted block of coordinates at a time."""
        if self._result is not None:
            return self._result
        if self.count == 0:
            raise ValueError("no update was aggregated this round")
        n, k = self.count, self.trimmed
        out = np.empty(self._size, dtype=self._dtype)
        for a in range(0, self._size, CHUNK):
            b = min(a + CHUNK, self._size)
            block = np.stack([u[a:b] for u in self._updates], axis=1)  # [coords, n]
            block.sort(axis=1)
            out[a:b] = block[:, k : n - k].mean(axis=1, dtype=np.float64)
        self._result = out
        return out

    def _view(self, flat: NDArray, name: str) -> NDArray:
        shape, dtype = self._spec[name]
        return flat[self._slice[name]].reshape(shape).astype(dtype, copy=False)

    def mean_delta(self) -> dict[str, NDArray[np.floating]]:
        """The robust aggregate delta (named for the StreamingFedAvg call it stands in for)."""
        agg = self._aggregate()
        return {name: self._view(agg, name) for name in self._spec}

    def apply(
        self, global_params: NumpyParams, in_place: bool = False
    ) -> dict[str, NDArray[np.floating]]:
        """The new global model; refuses a non-finite result. ``in_place`` builds it in the
        result buffer and releases the held updates (the aggregator is spent)."""
        for name, (shape, dtype) in self._spec.items():
            g = global_params.get(name)
            if g is None or g.shape != shape or g.dtype != dtype:
                raise ValueError(f"global tensor {name!r} does not match the update template")
        agg = self._aggregate()
        new: dict[str, NDArray[np.floating]] = {}
        for name in self._spec:
            step = self._view(agg, name)
            if in_place and step.dtype == self._dtype:  # a view of the result buffer
                np.add(global_params[name], step, out=step)
                new[name] = step
            else:
                new[name] = global_params[name] + step
            if not np.isfinite(new[name]).all():
                raise UpdateRejected("non_finite", "aggregated model is not finite; round refused")
        if in_place:
            self._updates, self.count = [], 0  # spent: free n models now, not at round end
        return new

    def dispersion(self) -> tuple[float, float, float]:
        """(mean |d_i|^2 of the clipped updates, |robust aggregate|^2, n): FedAvg's triple with
        equal weights, as the rule gives every kept update the same weight."""
        agg = self._aggregate()
        n = self.count
        return sum(self._sq_norms) / n, float(np.dot(agg, agg)), float(n)

    def projection(self) -> tuple[float, float] | None:
        """(mean of d_i . u, mean of (d_i . u)^2) over the clipped updates; None without a
        direction."""
        if self.count == 0:
            raise ValueError("no update was aggregated this round")
        if self._direction is None:
            return None
        p = np.asarray(self._proj)
        return float(p.mean()), float((p * p).mean())


#: what the round code (``powertrip.rounds.outcome.round_outcome``) reads from: either kind
Aggregator = StreamingFedAvg | RobustAggregator


@dataclass(frozen=True)
class Aggregation:
    """A run's aggregation setting, as one value the emulator and the service both pass on."""

    rule: Rule = DEFAULT_RULE
    clip_norm: float | None = None
    trim_beta: float | None = None
    #: ``robust``: judge norms per unit of weight (``RobustFedAvg.per_weight``)
    per_weight: bool = False
    #: ``robust``: the model's running statistics, averaged unclipped (``running_statistics``)
    statistics: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        check_settings(self.rule, self.clip_norm, self.trim_beta)

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> Aggregation:
        """From an experiment configuration."""
        return cls(cfg.aggregation, cfg.clip_norm, cfg.trim_beta)

    @property
    def adaptive(self) -> bool:
        """Whether the rule carries a bound from round to round (``AdaptiveBound``)."""
        return self.rule == "robust"

    def make(
        self,
        template: NumpyParams,
        direction: NumpyParams | None = None,
        bound: AdaptiveBound | None = None,
    ) -> Aggregator:
        """A round's aggregator; ``bound``: what the earlier rounds left (``robust`` only)."""
        return make_aggregator(
            self.rule,
            template,
            clip_norm=self.clip_norm,
            trim_beta=self.trim_beta,
            direction=direction,
            bound=bound,
            per_weight=self.per_weight,
            statistics=self.statistics,
        )


def make_aggregator(
    rule: str,
    template: NumpyParams,
    *,
    clip_norm: float | None = None,
    trim_beta: float | None = None,
    direction: NumpyParams | None = None,
    bound: AdaptiveBound | None = None,
    per_weight: bool = False,
    statistics: frozenset[str] = frozenset(),
) -> Aggregator:
    """The one factory of a round's aggregator: ``robust`` a ``RobustFedAvg`` from ``bound``
    (a run's first round: ``AdaptiveBound()``), ``fedavg`` the plain streaming
    ``StreamingFedAvg``; ``trimmed-mean`` and ``median`` a ``RobustAggregator``."""
    check_settings(rule, clip_norm, trim_beta)
    if rule == "robust":
        return RobustFedAvg(
            template, bound, direction=direction, per_weight=per_weight, statistics=statistics
        )
    if rule == "fedavg":
        return StreamingFedAvg(template, direction=direction)
    return RobustAggregator(
        template,
        rule,  # type: ignore[arg-type]
        clip_norm=clip_norm,
        trim_beta=trim_beta,
        direction=direction,
    )
