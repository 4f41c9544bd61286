"""Real training for the elastic engine: each site trains on exactly the data-stream rows the
cursor gave it, in order, and updates are averaged weighted by batches (spec §5.5)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numpy.typing import NDArray

from services.aggregator.fedavg import StreamingFedAvg
from services.aggregator.outer_step import NesterovOuter
from services.emulator.curtailment.engine import Checkpoints, LearnOutcome, SiteWork
from services.worker.trainer import SiteTrainer


class StreamLearner:
    """The global model of one run. ``order`` maps data-stream positions to training rows."""

    def __init__(
        self,
        trainer: SiteTrainer,
        x_train: torch.Tensor,
        y_train: torch.Tensor,
        x_test: torch.Tensor,
        y_test: torch.Tensor,
        order: NDArray[np.int64],
        params: dict[str, torch.Tensor],
        outer: NesterovOuter | None = None,
    ) -> None:
        if trainer.config.shuffle or trainer.config.local_epochs != 1:
            raise ValueError("the stream learner needs one unshuffled pass over the given rows")
        if trainer.config.max_local_steps is not None:
            raise ValueError("the stream learner's work is set by the clock, not max_local_steps")
        self.trainer = trainer
        self.x, self.y = x_train, y_train
        self.x_test, self.y_test = x_test, y_test
        self.order = order
        self.params = {k: v.detach().clone() for k, v in params.items()}
        self.outer = outer
        self._current: tuple[float, float] | None = None

    def evaluate(self) -> tuple[float, float]:
        if self._current is None:
            self._current = self._eval(self.params)
        return self._current

    def _eval(self, params: dict[str, torch.Tensor]) -> tuple[float, float]:
        return self.trainer.evaluate(params, self.x_test, self.y_test)

    def _train(self, params, rows: list[NDArray[np.int64]]):  # noqa: ANN001, ANN202
        return self.trainer.train(
            params, self.x, self.y, [self.order[r] for r in rows], [0] * len(rows)
        )

    def train_round(
        self, work: Sequence[SiteWork], checkpoints: Checkpoints | None
    ) -> LearnOutcome:
        active = [w for w in work if w.steps > 0]
        if not active:
            acc, loss = self.evaluate()
            return LearnOutcome(acc, loss)
        template = {k: v.numpy() for k, v in self.params.items()}
        lone = next((w for w in active if checkpoints and w.site == checkpoints.site), None)
        batched = [w for w in active if w is not lone]
        done: list[tuple[dict[str, np.ndarray], float]] = []  # (delta, batches)
        if batched:
            upd = self._train(self.params, [w.rows for w in batched])
            for j, w in enumerate(batched):
                done.append(({k: v[j].numpy() for k, v in upd.deltas.items()}, float(w.steps)))
        evals: list[tuple[float, float]] = []
        if lone is not None:  # train on alone in chunks (plain SGD: the same trajectory)
            b = self.trainer.config.batch_size
            local = self.params
            cuts = [0, *checkpoints.steps, lone.steps]
            for k0, k1 in zip(cuts[:-1], cuts[1:], strict=True):
                upd = self._train(local, [lone.rows[k0 * b : k1 * b]])
                local = {k: local[k] + upd.deltas[k][0] for k in local}
                delta = {k: (local[k] - self.params[k]).numpy() for k in local}
                if k1 != lone.steps:
                    model = self._aggregate(template, [*done, (delta, float(k1))], commit=False)
                    evals.append(self._eval(model))
            done.append((delta, float(lone.steps)))
        agg = StreamingFedAvg(template)
        for delta, weight in done:
            agg.add(delta, weight)
        dispersion = agg.dispersion()
        self.params = self._aggregate(template, done, commit=True)
        self._current = self._eval(self.params)
        return LearnOutcome(*self._current, dispersion, tuple(evals))

    def _aggregate(self, template, updates, commit: bool) -> dict[str, torch.Tensor]:  # noqa: ANN001
        """Work-weighted FedAvg of ``updates``, then the outer step if any; ``commit=False``
        leaves the outer optimizer's momentum untouched (a checkpoint, not a round)."""
        agg = StreamingFedAvg(template)
        for delta, weight in updates:
            agg.add(delta, weight)
        new = agg.apply(template)
        if self.outer is not None:
            new = self.outer.step(template, new, commit=commit)
        return {k: torch.from_numpy(v) for k, v in new.items()}
