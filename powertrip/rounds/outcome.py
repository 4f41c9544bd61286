"""A round's outcome from its folded updates: the one builder of ``RoundOutcome``.

The emulator (``powertrip.rounds.emulate``) and the aggregator service (its ``GrpcRoundExecutor``)
fold
their sites' updates in selection order into the aggregator
``powertrip.aggregation.robust.make_aggregator``
builds (``StreamingFedAvg``, or a robust rule); from there on a round is the
same arithmetic in both, kept here so the service reproduces the emulator bit for bit: the
updates' dispersion (the noise-scale gain model's input), the split-half probe, the projection
on the previous global delta, the FedAvg step of Eq. 2, the run's optional outer step
(``powertrip.aggregation.outer_step``) and the evaluation of the new model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from powertrip.aggregation.outer_step import NesterovOuter
from powertrip.aggregation.robust import Aggregator
from powertrip.aggregation.robust_fedavg import RobustFedAvg
from powertrip.learning.params import NumpyParams
from powertrip.rounds.loop import RoundOutcome

#: (accuracy, loss) of a model on the held-out set
Evaluate = Callable[[NumpyParams], tuple[float, float]]


def round_outcome(
    agg: Aggregator,
    params: NumpyParams,
    evaluate: Evaluate,
    *,
    selected: int,
    half: Aggregator | None = None,
    evaluate_half: bool = True,
    outer: NesterovOuter | None = None,
) -> RoundOutcome:
    """Commit ``agg`` onto the global model ``params`` and report the round.

    ``selected`` is the number of sites the policy picked: the split-half probe (``half``, the
    sum of every other selected site) needs two, since half of one site is the whole round.
    Without ``evaluate_half`` the half model is returned as ``half_params`` unevaluated (the
    emulator evaluates it only if a policy asks for it, ``evaluate_half_model``).
    ``agg`` and ``half`` are spent afterwards: the new model is built in ``agg``'s buffers and
    returned as the outcome's ``params`` (numpy; ``params`` itself is not modified).

    ``outer`` (the run's outer optimizer, None for plain FedAvg) then steps from ``params`` along
    the aggregate's pseudo-gradient, and its momentum is the outcome's ``outer_state``; the half
    model takes the same step as a preview, so the probe compares like with like.
    """
    contributions = agg.count
    dispersion = agg.dispersion()
    robust = agg if isinstance(agg, RobustFedAvg) else None
    half_loss = half_sites = half_accuracy = half_params = None
    if half is not None and half.count > 0 and selected >= 2:
        half_sites = half.dispersion()[2]
        half_params = half.apply(params, in_place=True)
        if outer is not None:  # from the same momentum, without advancing it
            half_params = outer.step(params, half_params, commit=False)
        if evaluate_half:
            half_accuracy, half_loss = evaluate(half_params)
            half_params = None
    projection = agg.projection()
    new = agg.apply(params, in_place=True)
    if outer is not None:
        new = outer.step(params, new)
    accuracy, loss = evaluate(new)
    return RoundOutcome(
        accuracy=accuracy,
        loss=loss,
        dispersion=dispersion,
        contributions=contributions,
        half_loss=half_loss,
        half_sites=half_sites,
        params=new,
        projection=projection,
        half_accuracy=half_accuracy,
        half_params=half_params,
        outer_state=None if outer is None else outer.state,
        aggregation_state=None if robust is None else robust.bound_after(),
        dropped=0 if robust is None else robust.dropped,
        clipped=getattr(agg, "clipped", 0),
    )


def evaluate_half_model(outcome: RoundOutcome, evaluate: Evaluate) -> RoundOutcome:
    """The outcome with its deferred split-half probe evaluated (unchanged if there is none)."""
    if outcome.half_params is None:
        return outcome
    half_accuracy, half_loss = evaluate(outcome.half_params)
    return replace(outcome, half_accuracy=half_accuracy, half_loss=half_loss, half_params=None)
