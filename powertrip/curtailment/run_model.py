"""What the curtailment-aware elastic engine plays and records: sites, each site's work in a
round, the rounds, and the run with its evaluations, pauses and power logs. The learning side
sees only ``SiteWork`` and answers with a ``LearnOutcome`` (the ``Learner`` protocol), so the
scheduling in ``engine.py`` can be tested without training anything."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from powertrip.curtailment.emissions import IDLE_KW, TRAIN_KW, SitePowerLog


@dataclass(frozen=True)
class ElasticSite:
    name: str
    region: str
    power: float = 1.0  # throughput fraction: a step takes step_s / power
    comm_s: float = 0.0  # upload of one update (Eq. 3)
    distance_mi: float = 0.0
    train_kw: float = TRAIN_KW
    idle_kw: float = IDLE_KW


@dataclass(frozen=True)
class SiteWork:
    """One site's share of one round."""

    site: int
    steps: int  # optimizer steps = batches, the FedAvg weight
    rows: NDArray[np.int64]  # data-stream positions, in training order
    train_start_s: float
    finish_s: float  # end of its last step
    left: bool  # its availability ended during the round: a partial update


@dataclass(frozen=True)
class Checkpoints:
    """Evaluate while ``site`` trains on alone (every other site of the round is done): after
    each of its step counts, the model the server would get if it stopped the round then."""

    site: int
    steps: tuple[int, ...]


@dataclass(frozen=True)
class LearnOutcome:
    accuracy: float
    loss: float
    dispersion: tuple[float, float, float] | None = None
    checkpoints: tuple[tuple[float, float], ...] = ()  # (accuracy, loss) per checkpoint
    # the probes of the PowerTrip executors; an elastic round measures none of them
    projection: tuple[float, float] | None = None
    half_loss: float | None = None
    half_sites: float | None = None
    half_accuracy: float | None = None


class Learner(Protocol):
    def evaluate(self) -> tuple[float, float]:
        """(accuracy, loss) of the current global model."""
        ...

    def train_round(
        self, work: Sequence[SiteWork], checkpoints: Checkpoints | None
    ) -> LearnOutcome:
        """Train every site with steps > 0 on its rows from the global model, aggregate them
        weighted by steps, and evaluate the checkpoints on the way."""
        ...


@dataclass(frozen=True)
class ElasticRound:
    index: int
    start_s: float
    train_start_s: float
    stop_s: float  # when the stop was published
    end_s: float  # when the aggregated model exists
    work: tuple[SiteWork, ...]
    accuracy: float
    loss: float

    @property
    def participants(self) -> tuple[int, ...]:
        return tuple(w.site for w in self.work)

    @property
    def contributors(self) -> tuple[int, ...]:
        return tuple(w.site for w in self.work if w.steps > 0)

    @property
    def batches(self) -> int:
        return sum(w.steps for w in self.work)


@dataclass
class ElasticRun:
    policy: str
    sites: tuple[ElasticSite, ...]
    total_rows: int
    rounds: list[ElasticRound] = field(default_factory=list)
    evaluations: list[tuple[float, float, float]] = field(default_factory=list)  # t, acc, loss
    pauses: list[tuple[float, float]] = field(default_factory=list)
    power_logs: list[SitePowerLog] = field(default_factory=list)
    end_s: float = 0.0
    rows_done: int = 0

    @property
    def finished(self) -> bool:
        """All data was trained on: like the curtailment prototype, a run ends when its data is
        used up."""
        return self.rows_done == self.total_rows

    def time_to(self, target: float) -> float | None:
        return next((t for t, acc, _ in self.evaluations if acc >= target), None)

    @property
    def best_accuracy(self) -> float:
        return max(acc for _, acc, _ in self.evaluations)

    @property
    def final_accuracy(self) -> float:
        return self.evaluations[-1][1]

    def mode_segments(self) -> list[tuple[float, float, str]]:
        """(start, end, "pause" | "solo" | "federated") over [0, end_s): a round is federated
        while two or more of its sites have not left, solo with one."""
        segs: list[tuple[float, float, str]] = [(a, b, "pause") for a, b in self.pauses]
        for r in self.rounds:
            leaves = sorted(w.finish_s for w in r.work if w.left)
            cuts = [r.start_s, *[x for x in leaves if r.start_s < x < r.end_s], r.end_s]
            for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
                n = len(r.work) - k
                if b > a:
                    segs.append((a, b, "federated" if n >= 2 else "solo" if n == 1 else "pause"))
        segs.sort()
        last = segs[-1][1] if segs else 0.0
        if last < self.end_s:
            segs.append((last, self.end_s, "pause"))
        merged: list[tuple[float, float, str]] = []
        for a, b, mode in segs:
            if merged and merged[-1][2] == mode and merged[-1][1] >= a:
                merged[-1] = (merged[-1][0], max(b, merged[-1][1]), mode)
            else:
                merged.append((a, b, mode))
        return merged
