"""Aggregation rules for rounds that may include hostile sites (reliability rows R13, R33).

Plain FedAvg (``powertrip.fedavg``) lets one site move the global model anywhere: a single update
of finite but huge values (every float 1e30) sets the mean. The default rule, ``robust``, is
TensorFlow Federated's recommended ``tff.learning.robust_aggregator`` without noise, folded as
the updates stream in:

- **zeroing**: an update whose L2 norm is above ``2 * q98 + 1`` is dropped and counted, where
  ``q98`` is a running estimate of the 0.98 quantile of update norms;
- **adaptive clipping**: every other update is clipped in L2 to ``C``, a running estimate of
  the median of update norms (``CLIP``: TFF's tutorial and Andrew et al.'s target; the
  ``robust_aggregator`` default of 0.8 gives way to a 20 % hostile share), then the updates
  are averaged with their sample weights (a clipped update keeps its weight, as in TFF's
  ClippingFactory); a dropped update takes no part in the mean (a site that did not report).

Both estimates are quantile matching without noise (Andrew, Thakkar et al., "Differentially
private learning with adaptive clipping", 2021): after each committed round,
``q <- q * exp(-lr * (b - gamma))`` with ``b`` the fraction of that round's update norms at or
below ``q``; TFF's settings: clipping (lr 0.2), zeroing (initial 10.0, gamma 0.98, lr ln 10,
multiplier 2, increment 1); the clip targets the median and starts at 0.25 (see ``CLIP``).
A round's decisions use only what earlier rounds left (``AdaptiveBound``, checkpointed with
the run), so each update is judged the moment it is whole, and one round moves an estimate by
a bounded factor: ``exp(lr * gamma)`` up at most (1.11 for the clip, 9.5 for zeroing),
``exp(lr * (1 - gamma))`` down. A hostile minority ``f`` of the norms in a round pushes the
clip estimate up only if ``f > 1 - 0.5``: below that the honest majority alone pulls it to
their own quantile (docs/robust-aggregation.md measures the drag over 50 rounds and what it
buys the attacker).

**Units.** Norms are measured relative to the global model the round starts from: ``|d| / |w|``
(an update as long as the model itself has relative norm 1), so one setting serves a 10 k
parameter CNN and a 100 M parameter LM alike. TFF's absolute initial values read as relative
ones here, but for the clip's start: the first round clips at ``0.25 |w|`` (above the honest
first-round norms measured, ``CLIP``) and zeroes above ``21 |w|``, and the ``+ 1`` increment
means an update shorter than the model is never zeroed. A model of norm 0 (all-zero
initialisation) is measured in TFF's absolute units. Norms are summed in float64 whatever the
model's dtype, so the same update gets the same decision whether it arrived as rows (the
emulator) or as streamed pieces (the aggregator service).

The order-statistic rules stay available:

- ``trimmed-mean``: per coordinate, drop the ``k = floor(beta * n)`` largest and ``k`` smallest
  values and average the rest. Tolerates up to ``k`` hostile updates.
- ``median``: per coordinate (mean of the two middle values for even n). Tolerates
  ``ceil(n / 2) - 1`` hostile updates.
- ``clip_norm`` C: a fixed L2 clip of each update before either of them sees it.

Both ignore the weight (``num_examples``), as Flower's FedTrimmedAvg and FedMedian do. They
hold every update at once: n model-sized updates where the streaming rules (``fedavg``,
``robust``) hold one model-sized sum whatever n (docs/robust-aggregation.md). ``fedavg`` is the
paper's plain mean, opt-in (``--aggregation fedavg``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import NDArray

from powertrip.fedavg import (
    NumpyParams,
    StreamingFedAvg,
    UpdateFold,
    UpdateRejected,
)
from powertrip.fold_inputs import NORM_BLOCK, check_weight, validate_update

if TYPE_CHECKING:
    from powertrip.experiment import ExperimentConfig

Rule = Literal["robust", "fedavg", "trimmed-mean", "median"]
RULES: tuple[str, ...] = ("robust", "fedavg", "trimmed-mean", "median")
#: the rule a run gets unless it names one
DEFAULT_RULE: Rule = "robust"
DEFAULT_TRIM_BETA = 0.2
#: coordinates sorted at once: the working block is n x CHUNK values, never n x model
CHUNK = 1 << 16


def check_settings(rule: str, clip_norm: float | None, trim_beta: float | None) -> None:
    """ValueError naming the setting when the combination is unusable. Settings a rule would
    silently ignore are refused too, so a run never looks defended when it is not."""
    if rule not in RULES:
        raise ValueError(f"aggregation must be one of {', '.join(RULES)}, got {rule!r}")
    if clip_norm is not None and not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm must be a finite number > 0, got {clip_norm}")
    if trim_beta is not None:
        check_trim_beta(trim_beta)
        if rule != "trimmed-mean":
            raise ValueError(
                "trim_beta (--trim-beta, POWERTRIP_TRIM_BETA) applies to aggregation "
                f"trimmed-mean only, not {rule!r}"
            )
    if clip_norm is not None and rule in ("fedavg", "robust"):
        raise ValueError(
            "clip_norm (--clip-norm, POWERTRIP_CLIP_NORM) is a fixed clip for trimmed-mean or "
            f"median; {rule!r} "
            + ("clips adaptively already" if rule == "robust" else "never clips (plain mean)")
        )


def check_trim_beta(beta: float | None) -> float | None:
    """beta in [0, 0.5) makes 2*floor(beta*n) < n for every n, so some values always remain."""
    if beta is not None and not 0 <= beta < 0.5:
        raise ValueError(f"must be in [0, 0.5) so that 2*floor(beta*n) < n, got {beta}")
    return beta


@dataclass(frozen=True)
class QuantileEstimate:
    """One running quantile estimate of update norms (quantile matching without noise): the
    ``gamma`` quantile, moved by ``exp(-lr * (b - gamma))`` per round."""

    estimate: float
    gamma: float
    lr: float

    def step(self, norms: Sequence[float]) -> QuantileEstimate:
        """The estimate after a round whose update norms were ``norms`` (unchanged for none).
        ``b`` counts a non-finite norm as above the estimate."""
        if not norms:
            return self
        below = sum(1 for n in norms if n <= self.estimate) / len(norms)
        return replace(self, estimate=self.estimate * math.exp(-self.lr * (below - self.gamma)))


#: The clip: quantile matching to the median (gamma 0.5, lr 0.2), as in Andrew, Thakkar et al.
#: and TFF's tutorial "Tuning recommended aggregations"; ``robust_aggregator`` itself targets
#: 0.8, which a hostile share above 20 % of a round's updates pulls upwards, and a policy that
#: ranks sites concentrates its picks (PowerTrip on the quick preset with one site in 8 hostile
#: picked 3 of 13 every round and ended 0.05 below the clean run at 0.8; at 0.5, level with it).
#: Its initial estimate is 0.25 of the model's norm, not TFF's absolute 1.0 (a few percent of a
#: typical model's norm): measured first-round norms are 0.05-0.33 for the quick preset's CNN
#: (median 0.19) and 0.15 for the 4-site DiLoCo LM, and at 1.0 one site sending a 10x copy of
#: its update among 10 wrecked the CNN in round 1 (docs/robust-aggregation.md).
CLIP = QuantileEstimate(0.25, gamma=0.5, lr=0.2)
ZEROING = QuantileEstimate(10.0, gamma=0.98, lr=math.log(10.0))
ZEROING_MULTIPLIER, ZEROING_INCREMENT = 2.0, 1.0


@dataclass(frozen=True)
class AdaptiveBound:
    """The ``robust`` rule's state across rounds: the clip and zeroing estimates, in units of
    the global model's norm. A run starts from ``AdaptiveBound()``; each committed round hands
    the next its ``RobustFedAvg.bound_after()``. ``state_dict`` / ``from_state_dict`` are the
    checkpoint's form (plain floats, as PyTorch optimizers' state dicts)."""

    clip: QuantileEstimate = CLIP
    zeroing: QuantileEstimate = ZEROING

    @property
    def clip_norm(self) -> float:
        return self.clip.estimate

    @property
    def zeroing_norm(self) -> float:
        return ZEROING_MULTIPLIER * self.zeroing.estimate + ZEROING_INCREMENT

    def after(self, norms: Sequence[float]) -> AdaptiveBound:
        return AdaptiveBound(self.clip.step(norms), self.zeroing.step(norms))

    def state_dict(self) -> dict[str, float]:
        return {"clip": self.clip.estimate, "zeroing": self.zeroing.estimate}

    @classmethod
    def from_state_dict(cls, state: object) -> AdaptiveBound:
        """The bound ``state_dict`` wrote; ValueError naming the field that is not a finite
        positive number (a damaged or forged checkpoint is refused at load)."""
        if not isinstance(state, dict) or set(state) != {"clip", "zeroing"}:
            raise ValueError(f"aggregation state is not {{clip, zeroing}}: {state!r:.80}")
        for key in ("clip", "zeroing"):
            v = state[key]
            ok = isinstance(v, int | float) and not isinstance(v, bool)
            if not (ok and math.isfinite(v) and v > 0):
                raise ValueError(f"aggregation state {key} is {v!r}, not a finite number > 0")
        return cls(
            replace(CLIP, estimate=float(state["clip"])),
            replace(ZEROING, estimate=float(state["zeroing"])),
        )


def model_norm(params: NumpyParams) -> float:
    """|w| in float64; the unit of the ``robust`` rule's norms (1.0 for an all-zero model)."""
    norm = math.sqrt(sum(exact_sq_norm(a) for a in params.values()))
    return norm if norm > 0 and math.isfinite(norm) else 1.0


def exact_sq_norm(a: NDArray) -> float:
    """``a``'s squared norm summed in float64 by blocks: a float32 value's square is exact in
    float64, so slicing an update differently changes the sum only in its last float64 bits,
    never a clip decision made on float32-rounded norms (``RobustFedAvg``)."""
    flat = np.asarray(a).reshape(-1)
    total = 0.0
    for i in range(0, flat.size, NORM_BLOCK):
        block = flat[i : i + NORM_BLOCK].astype(np.float64)
        total += float(np.dot(block, block))
    return total


class RobustFedAvg(StreamingFedAvg):
    """Streaming FedAvg of zeroed and clipped updates: TFF's ``robust_aggregator``.

    Each update is judged once it is whole, from ``bound`` (what earlier rounds left) and the
    norm of the model the round starts from: dropped above the zeroing norm, else scaled by
    ``min(1, C / |d|)`` and folded with its weight. Memory stays one model-sized sum (a streamed
    update is read twice: its norm, then the fold). ``dropped`` and ``clipped`` count this
    round's decisions; ``bound_after()`` is the next round's bound.
    """

    def __init__(
        self,
        template: NumpyParams,
        bound: AdaptiveBound | None = None,
        *,
        direction: NumpyParams | None = None,
        reference_norm: float | None = None,
        per_weight: bool = False,
    ) -> None:
        super().__init__(template, direction=direction)
        self.bound = bound or AdaptiveBound()
        #: norms per unit of weight, where the weight is the work that made the update (the
        #: curtailment mode's local steps, assigned by the aggregator): a site that trained k
        #: steps may send an update k times one step's length
        self.per_weight = per_weight
        self.reference_norm = model_norm(template) if reference_norm is None else reference_norm
        self.clip_norm = self.bound.clip_norm * self.reference_norm
        self.zeroing_norm = self.bound.zeroing_norm * self.reference_norm
        self.norms: list[float] = []  # every judged update's relative norm, in fold order
        self.dropped = 0
        self.clipped = 0

    def judge(self, sq: float, weight: float = 1.0) -> float | None:
        """The scale for an update of squared norm ``sq`` (float64) and ``weight``, or None to
        drop it."""
        with np.errstate(over="ignore"):  # a norm past float32's range is inf: dropped
            norm = float(np.float32(math.sqrt(sq))) if math.isfinite(sq) else math.inf
        unit = weight if self.per_weight else 1.0
        self.norms.append(norm / (self.reference_norm * unit))
        if not norm <= self.zeroing_norm * unit:
            self.dropped += 1
            return None
        if norm > self.clip_norm * unit:
            self.clipped += 1
            return self.clip_norm * unit / norm
        return 1.0

    def add(self, delta: NumpyParams, weight: float) -> None:
        norms = validate_update(self._spec, delta, weight)
        scale = self.judge(sum(exact_sq_norm(delta[name]) for name in self._spec), weight)
        if scale is not None:
            self._fold(((name, 0, delta[name]) for name in self._spec), weight, sum(norms), scale)

    def add_pieces(self, pieces: Iterable[tuple[str, int, NDArray]], weight: float) -> None:
        """Validated slices of one update (``StreamingFedAvg.add_pieces``); read twice, so an
        iterator is held whole first (pass a re-iterable to spare the copy)."""
        check_weight(weight)
        if iter(pieces) is pieces:  # copies: a stream's pieces may share one buffer
            pieces = [(name, start, np.array(values)) for name, start, values in pieces]
        scale = self.judge(sum(exact_sq_norm(values) for _, _, values in pieces), weight)
        if scale is not None:
            self._fold(pieces, weight, None, scale)

    def add_rows(
        self,
        stacked: NumpyParams,
        weights: Sequence[float],
        sq_norms: NDArray | None = None,
        scales: NDArray | None = None,
    ) -> NDArray | None:
        """Every row judged in order, then folded at once (``StreamingFedAvg.add_rows``); a
        dropped row is left out. Returns every row's squared norm (NaN for a dropped one);
        a probe over a subset of the rows judges them itself, so it gets the same decisions."""
        if scales is not None:
            raise ValueError("RobustFedAvg chooses its own scales")
        w = np.asarray(weights, dtype=np.float64)
        names = list(self._spec)
        if stacked.keys() != self._spec.keys():  # the base class names the problem
            return super().add_rows(stacked, weights)
        judged = []
        for j in range(w.size):
            sq = sum(exact_sq_norm(np.asarray(stacked[n])[j]) for n in names)
            judged.append(self.judge(sq, float(w[j])))
        keep = [j for j, s in enumerate(judged) if s is not None]
        if not keep:
            return np.full(w.size, np.nan)
        rows = stacked
        if len(keep) < w.size:  # a copy of the kept rows: only in a round with a dropped one
            rows = {n: np.asarray(a)[keep] for n, a in stacked.items()}
        kept_scales = np.asarray([judged[j] for j in keep], dtype=np.float64)
        plain = bool(np.all(kept_scales == 1.0))
        sq = super().add_rows(rows, w[keep], None, None if plain else kept_scales)
        if sq is None:
            return None
        out = np.full(w.size, np.nan)
        out[keep] = sq
        return out

    def bound_after(self) -> AdaptiveBound:
        """The bound for the next round: this round's norms moved each estimate one step."""
        return self.bound.after(self.norms)


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


#: what the round code (``powertrip.outcome.round_outcome``) reads from: either kind
Aggregator = StreamingFedAvg | RobustAggregator


@dataclass(frozen=True)
class Aggregation:
    """A run's aggregation setting, as one value the emulator and the service both pass on."""

    rule: Rule = DEFAULT_RULE
    clip_norm: float | None = None
    trim_beta: float | None = None
    #: ``robust``: judge norms per unit of weight (``RobustFedAvg.per_weight``)
    per_weight: bool = False

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
) -> Aggregator:
    """The one factory of a round's aggregator: ``robust`` a ``RobustFedAvg`` from ``bound``
    (a run's first round: ``AdaptiveBound()``), ``fedavg`` the plain streaming
    ``StreamingFedAvg``; ``trimmed-mean`` and ``median`` a ``RobustAggregator``."""
    check_settings(rule, clip_norm, trim_beta)
    if rule == "robust":
        return RobustFedAvg(template, bound, direction=direction, per_weight=per_weight)
    if rule == "fedavg":
        return StreamingFedAvg(template, direction=direction)
    return RobustAggregator(
        template,
        rule,  # type: ignore[arg-type]
        clip_norm=clip_norm,
        trim_beta=trim_beta,
        direction=direction,
    )
