"""Every number a peer reports is bounded here, before a policy or a gauge sees it: one rule.

A worker's update header holds claims about its site. Each is checked against what the
aggregator itself knows:

=============  ==========================================  ======================================
claim          who reads it                                bound
=============  ==========================================  ======================================
num_samples    the fold (FedAvg weight); Oort, EcoLearn,   at least 1, at most the shard the
               FedZero (n_i in the utility)                aggregator assigned the site (R26):
                                                           ``samples_problem`` / ``bound_samples``
train_loss     Oort, EcoLearn, FedZero (the statistical    in [0, ``loss_ceiling``]: else
               utility n_i * loss_i)                       refused and replaced (``bound_losses``)
train_seconds  nothing on the aggregator (the round's      none needed: no policy, metric or
               time is its own clock's)                    gauge reads it
shard, round,  the intake's checks (``shards.py``,         refused with the update
tensor sizes   ``RoundGate``, the stream receiver)
=============  ==========================================  ======================================

The loss. The aggregator cannot see a site's data, but it evaluates every global model on its
own held-out set. A site's mean training loss starts at the loss of the global model on its data
and falls as it trains, so an honest report sits near that evaluated loss: in the quick preset
(20 sites, 40 rounds of Oort) every site's report stayed within 1.09x (Dirichlet 0.3) and 1.22x
(IID) of the evaluated loss of the model its update made. The ceiling is ``LOSS_CEILING_FACTOR``
(3) times that loss: room for a skewed site, and no claim above it counts. A fixed bound
such as ``log(num_classes)`` would need the workload's class count in the round loop and does
not hold for a language model, where the loss is over a vocabulary.

Refused, not clipped: a clipped lie sits at the top of the allowed range, and Oort normalises
utilities min-max, so the top of any range is the top utility: a site clipped to the ceiling
would still be picked almost every round. A loss outside [0, ceiling] (NaN, infinite, negative,
above the ceiling) or missing from a site whose update was folded is replaced by the round's
neutral loss: the median of the in-range losses of the round's other folded sites. The site
counts as having trained with a typical loss, so it gains nothing; it is not left unexplored
either, which under Oort would earn it an exploration slot each round. With no other loss in
range (a site alone in its round) nothing says what is typical, and the claim is credited
nothing (0): the evaluated loss would not do, as honest training losses mostly lie below it.
What this does not stop: a lie inside the range. Oort, EcoLearn and FedZero rank sites by the
claimed loss, so a site that claims a little more than honest sites do wins their top utility:
1.2x the evaluated loss was picked in 55 to 59 of 60 rounds in the simulation of
``tests/unit/test_reported.py`` (honest sites there report at most 1x), against 12 to 17 when
honest. No ceiling loose enough for an honest skewed site prevents that; only a utility the
aggregator measures itself (from the update it receives, or the site's loss on data of its own)
would.

NaN in a loss array means "not measured" (the site's update was not folded) and stays NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

#: a reported training loss may be at most this multiple of the round's evaluated global loss
LOSS_CEILING_FACTOR = 3.0

#: the reasons a reported number is refused: a bounded set (Prometheus labels)
REASONS = ("missing", "not_finite", "negative", "above_ceiling", "not_integer", "out_of_range")


@dataclass(frozen=True)
class Refusal:
    """Why a reported number was not used as reported."""

    reason: str  # one of REASONS
    detail: str  # plain words for the log line


def loss_ceiling(reference: float | None) -> float:
    """The largest training loss a site may report in a round whose new global model the
    aggregator evaluated at ``reference``; no ceiling (inf) without a usable reference."""
    if reference is None or not math.isfinite(reference) or reference < 0:
        return math.inf
    return LOSS_CEILING_FACTOR * reference


def loss_refusal(loss: float | None, ceiling: float = math.inf) -> Refusal | None:
    """Why ``loss`` may not reach a policy (None: it may)."""
    if loss is None:
        return Refusal("missing", "is missing")
    if not math.isfinite(loss):
        return Refusal("not_finite", f"must be finite, got {loss!r}")
    if loss < 0:
        return Refusal("negative", f"must be >= 0, got {loss!r}")
    if loss > ceiling:
        return Refusal(
            "above_ceiling",
            f"must be at most {ceiling:.4g} ({LOSS_CEILING_FACTOR:g}x the global model's "
            f"evaluated loss), got {loss:.4g}",
        )
    return None


def samples_problem(samples: float, most: float | None) -> Refusal | None:
    """Why ``samples`` is not a sample count of a site assigned ``most`` samples (None: it is)."""
    if not math.isfinite(samples):
        return Refusal("not_finite", f"must be an integer, got {samples!r}")
    if samples != int(samples):
        return Refusal("not_integer", f"must be an integer, got {samples!r}")
    if samples < 1 or (most is not None and samples > most):
        top = "its shard" if most is None else f"{most:g}, the shard assigned to it"
        return Refusal("out_of_range", f"must be at least 1 and at most {top}, got {samples:g}")
    return None


def bound_samples(samples: float, most: float | None) -> float:
    """The sample count a policy may use for a folded site that claimed ``samples``: the claim
    when it passes ``samples_problem``, else the nearest whole count in [1, ``most``] (the fold
    already held its weight to that range; only a fraction or a missing bound is left)."""
    if samples_problem(samples, most) is None:
        return float(samples)
    top = most if most is not None and math.isfinite(most) else math.inf
    value = 1.0 if math.isnan(samples) else min(max(samples, 1.0), top)
    return float(max(1.0, math.floor(value))) if math.isfinite(value) else 1.0


@dataclass(frozen=True)
class BoundedLosses:
    """A round's per-site losses as a policy may see them, and what was refused."""

    values: NDArray[np.float64] | None
    refused: tuple[tuple[int, Refusal], ...] = ()  # (position in the array, why)


def bound_losses(
    claimed: Sequence[float | None] | NDArray[np.float64] | None,
    reference: float | None,
    trained: Sequence[bool] | NDArray[np.bool_] | None = None,
) -> BoundedLosses:
    """``claimed`` (per site, NaN where not measured) with every refused loss replaced by the
    round's neutral loss (see the module's docstring). ``trained``: which sites' updates were
    folded (a folded site's NaN, or None: no claim, is then refused; an unfolded site's value
    is dropped); None: the sites whose value is not NaN. Applying it twice changes nothing."""
    if claimed is None:
        return BoundedLosses(None)
    raw = [None if v is None else float(v) for v in np.asarray(claimed, dtype=object).ravel()]
    x = np.array([math.nan if v is None else v for v in raw], dtype=np.float64)
    did = ~np.isnan(x) if trained is None else np.asarray(trained, dtype=bool).reshape(-1)
    if did.shape != x.shape:
        raise ValueError(f"{x.size} losses but {did.size} trained flags")
    ceiling = loss_ceiling(reference)
    why = [loss_refusal(v, ceiling) if t else None for v, t in zip(raw, did, strict=True)]
    refused = tuple((i, r) for i, r in enumerate(why) if r is not None)
    x[~did] = np.nan
    if refused:
        bad = np.zeros(x.size, dtype=bool)
        bad[[i for i, _ in refused]] = True
        x[bad] = neutral_loss(x[did & ~bad])
    return BoundedLosses(x, refused)


def neutral_loss(in_range: NDArray[np.float64]) -> float:
    """The loss a refused claim counts as: the median of the round's in-range losses, else 0
    (nothing to compare with: no credit)."""
    return float(np.median(in_range)) if in_range.size else 0.0
