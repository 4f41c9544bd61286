"""Real training for the elastic engine: each site trains on exactly the data-stream rows the
cursor gave it, in order, and updates are averaged weighted by the batches each site processed
(the work-weighted FedAvg of the curtailment-window study, arXiv 2602.22760).

``FoldingLearner`` owns the round's arithmetic (who trains from which model, the checkpoint
models of a lone site, the FedAvg, robust by default (``powertrip.aggregation.robust``, norms
per local step), and the outer step); subclasses only say how a set of sites is trained: in
process (``StreamLearner``) or on the workers (the aggregator's ``GrpcLearner``).
Both then fold the same deltas in the same order, so the service reproduces the emulator; with
an update codec each sub-round's update is coded with its site's error feedback on both (in
process here, by the worker there), so the same decoded deltas are folded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from powertrip import state_dict as sd
from powertrip.aggregation.outer_step import NesterovOuter
from powertrip.aggregation.robust import Aggregation, Aggregator
from powertrip.aggregation.robust_fedavg import AdaptiveBound, RobustFedAvg
from powertrip.codecs import ErrorFeedback, get_codec
from powertrip.curtailment.run_model import Checkpoints, LearnOutcome, SiteWork
from powertrip.learning.device import TorchParams, to_host, to_numpy, to_torch
from powertrip.learning.params import NumpyParams
from powertrip.learning.site_optim import SiteState
from powertrip.learning.state_book import SiteStateBook, round_key
from powertrip.learning.trainer import SiteTrainer, SiteUpdates

Evaluate = Callable[[TorchParams], tuple[float, float]]


def check_stream_trainer(trainer: SiteTrainer) -> None:
    if trainer.config.shuffle or trainer.config.local_epochs != 1:
        raise ValueError("the stream learner needs one unshuffled pass over the given rows")
    if trainer.config.max_local_steps is not None:
        raise ValueError("the stream learner's work is set by the clock, not max_local_steps")


def train_stream_rows(
    trainer: SiteTrainer,
    x: torch.Tensor,
    y: torch.Tensor,
    order: NDArray[np.int64],
    params: TorchParams,
    rows: Sequence[NDArray[np.int64]],
    states: Sequence[SiteState | None] | None = None,
) -> SiteUpdates:
    """Train each site on its data-stream positions (``order`` maps them to training rows), in
    order, from ``params``: the one training step of the emulator and of the worker.
    ``states``: each site's local optimizer state to resume (None: fresh)."""
    return trainer.train(params, x, y, [order[r] for r in rows], [0] * len(rows), states)


class FoldingLearner:
    def __init__(
        self,
        params: TorchParams,
        evaluate: Evaluate,
        batch_size: int,
        outer: NesterovOuter | None = None,
        aggregation: Aggregation | None = None,
    ) -> None:
        # In host memory, like the deltas and the averaged models: one device for the arithmetic.
        self.params = {k: to_host(v).clone() for k, v in params.items()}
        self._eval = evaluate
        self.batch_size = batch_size
        self.outer = outer
        # The round's rule: robust by default, its norms per local step (an update's weight is
        # the steps the aggregator gave the site), so a lone site's long stretch is judged by
        # its per-step length, not cut short for being long.
        self.aggregation = aggregation or Aggregation(per_weight=True)
        #: the robust rule's bound from the committed rounds (None for another rule)
        self.bound = AdaptiveBound() if self.aggregation.adaptive else None
        self._current: tuple[float, float] | None = None

    def train_sites(
        self, params: TorchParams, sites: Sequence[int], rows: Sequence[NDArray[np.int64]]
    ) -> list[TorchParams | None]:
        """Each site's delta after training its rows from ``params``, in the given order; None
        for a site whose update did not arrive (the workers' learner: a dead worker, a
        deadline)."""
        raise NotImplementedError

    def evaluate(self) -> tuple[float, float]:
        if self._current is None:
            self._current = self._eval(self.params)
        return self._current

    def start_round(self) -> None:
        """A round begins: a learner whose sites keep no optimizer state across rounds drops
        it here (a lone site's chunks within a round always carry it)."""

    def state_dict(self) -> dict[str, Any]:
        """What the learner carries between rounds besides the model and the outer momentum
        (a checkpoint's arrays): the robust rule's bound and the current model's evaluation."""
        return {
            "bound": None if self.bound is None else self.bound.state_dict(),
            "current": None if self._current is None else list(self._current),
        }

    @staticmethod
    def read_state(
        state: object, adaptive: bool
    ) -> tuple[AdaptiveBound | None, tuple[float, float] | None]:
        """``state_dict()``'s value, checked for a learner whose rule is ``adaptive`` or not:
        (bound, current evaluation); TypeError or ValueError naming the field."""
        d = sd.fields(state, "learner state", {"bound", "current"})
        if (d["bound"] is None) == adaptive:
            raise ValueError("learner state.bound: written under another aggregation rule")
        bound = None if d["bound"] is None else AdaptiveBound.from_state_dict(d["bound"])
        return bound, sd.pair(d["current"], "learner state.current")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``'s value (the model and momentum are restored by the
        caller); TypeError or ValueError naming the field that does not fit (left unchanged)."""
        self.bound, self._current = self.read_state(state, self.aggregation.adaptive)

    def train_round(
        self, work: Sequence[SiteWork], checkpoints: Checkpoints | None
    ) -> LearnOutcome:
        """The round's model: each active site's delta, work-weighted. A site whose update did
        not arrive counts for the steps it delivered (none, or a lone site's chunks up to the
        lost one; the rest of its stretch is not asked for), as the curtailment paper
        aggregates whoever reported; when nobody did, the model is unchanged."""
        self.start_round()
        active = [w for w in work if w.steps > 0]
        if not active:
            acc, loss = self.evaluate()
            return LearnOutcome(acc, loss)
        template = to_numpy(self.params)
        lone = next((w for w in active if checkpoints and w.site == checkpoints.site), None)
        batched = [w for w in active if w is not lone]
        done: list[tuple[NumpyParams, float]] = []  # (delta, batches)
        lost: list[tuple[int, int]] = []
        if batched:
            deltas = self.train_sites(
                self.params, [w.site for w in batched], [w.rows for w in batched]
            )
            for d, w in zip(deltas, batched, strict=True):
                if d is None:
                    lost.append((w.site, 0))
                else:
                    done.append((to_numpy(d), float(w.steps)))
        evals: list[tuple[float, float]] = []
        if lone is not None:  # train on alone in chunks (plain SGD: the same trajectory)
            assert checkpoints is not None  # lone is checkpoints' site
            b = self.batch_size
            local = self.params
            cuts = [0, *checkpoints.steps, lone.steps]
            kept, delta = 0, None
            for k0, k1 in zip(cuts[:-1], cuts[1:], strict=True):
                if kept == k0:  # every chunk so far arrived: ask for the next
                    (d,) = self.train_sites(local, [lone.site], [lone.rows[k0 * b : k1 * b]])
                    if d is not None:
                        local = {k: local[k] + d[k] for k in local}
                        delta = to_numpy({k: local[k] - self.params[k] for k in local})
                        kept = k1
                if k1 != lone.steps:  # the model the server would have now
                    partial = [] if delta is None else [(delta, float(kept))]
                    model = self._aggregate(template, [*done, *partial], commit=False)
                    evals.append(self._eval(model))
            if delta is not None:
                done.append((delta, float(kept)))
            if kept != lone.steps:
                lost.append((lone.site, kept))
        agg = self._fold(template, done)
        dispersion = agg.dispersion() if agg.count else None
        self.params = self._aggregate(template, done, commit=True)
        self._current = self._eval(self.params)
        return LearnOutcome(*self._current, dispersion, tuple(evals), lost=tuple(lost))

    def _fold(
        self, template: NumpyParams, updates: Sequence[tuple[NumpyParams, float]]
    ) -> Aggregator:
        """``updates`` folded by the run's rule, from the bound the committed rounds left."""
        agg = self.aggregation.make(template, bound=self.bound)
        for delta, weight in updates:
            agg.add(delta, weight)
        return agg

    def _aggregate(
        self, template: NumpyParams, updates: Sequence[tuple[NumpyParams, float]], commit: bool
    ) -> TorchParams:
        """Work-weighted FedAvg of ``updates`` (robust by default), then the outer step if any;
        ``commit=False`` leaves the outer momentum and the rule's bound untouched (a
        checkpoint, not a round). Every update dropped: the model as it was."""
        agg = self._fold(template, updates)
        if agg.count == 0:
            return to_torch(template)
        if commit and isinstance(agg, RobustFedAvg):
            self.bound = agg.bound_after()
        new = agg.apply(template)
        if self.outer is not None:
            new = self.outer.step(template, new, commit=commit)
        return to_torch(new)


class StreamLearner(FoldingLearner):
    """The global model of one run, trained in process. ``order`` maps data-stream positions to
    training rows; ``codec``: the update codec each site's update goes through (with its
    residual unless ``error_feedback`` is False), as a worker's upload does."""

    def __init__(
        self,
        trainer: SiteTrainer,
        x_train: torch.Tensor,
        y_train: torch.Tensor,
        x_test: torch.Tensor,
        y_test: torch.Tensor,
        order: NDArray[np.int64],
        params: TorchParams,
        outer: NesterovOuter | None = None,
        aggregation: Aggregation | None = None,
        codec: str = "none",
        error_feedback: bool = True,
    ) -> None:
        check_stream_trainer(trainer)
        super().__init__(
            params,
            lambda p: trainer.evaluate(p, x_test, y_test),
            trainer.config.batch_size,
            outer,
            aggregation,
        )
        self.trainer = trainer
        self.x, self.y = x_train, y_train
        self.order = order
        recipe = trainer.config.recipe
        #: each site's local optimizer state (none kept for plain SGD) and codec residual; a
        #: site's state carries on within a round (a lone site's chunks) and is reset per the
        #: recipe at its first sub-round of a new one
        self.book = SiteStateBook(recipe)
        self._keeps = not recipe.plain_sgd
        self.feedback = (
            None if codec == "none" else ErrorFeedback(get_codec(codec), error_feedback, self.book)
        )
        self._round = self._sub_round = 0

    @property
    def site_states(self) -> dict[int, SiteState] | None:
        """Each site's newest optimizer state (None: plain SGD keeps none)."""
        return self.book.states() if self._keeps else None

    def start_round(self) -> None:
        self._round += 1

    def train_sites(
        self, params: TorchParams, sites: Sequence[int], rows: Sequence[NDArray[np.int64]]
    ) -> list[TorchParams | None]:
        self._sub_round += 1
        key, book = round_key(self._round, self._sub_round), self.book
        states = [book.for_round(s, key) for s in sites] if self._keeps else None
        upd = train_stream_rows(self.trainer, self.x, self.y, self.order, params, rows, states)
        if self._keeps and upd.opt_state is not None:
            for site, state in zip(sites, upd.opt_state, strict=True):
                book.update(site, key, state=state)
        deltas = [{k: v[j] for k, v in upd.deltas.items()} for j in range(len(rows))]
        if self.feedback is None:
            return list(deltas)
        apply = self.feedback.apply
        return [to_torch(apply(s, to_numpy(d), key)) for s, d in zip(sites, deltas, strict=True)]
