"""What the curtailment-aware elastic engine plays and records: sites, each site's work in a
round, the rounds, and the run with its evaluations, pauses and power logs. The learning side
sees only ``SiteWork`` and answers with a ``LearnOutcome`` (the ``Learner`` protocol), so the
scheduling in ``engine.py`` can be tested without training anything."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from powertrip import state_dict as sd
from powertrip.config.footprint import IDLE_KW, TRAIN_KW
from powertrip.curtailment.emissions import SitePowerLog


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
    #: (site, steps kept) of each site whose update did not arrive whole (a dead worker, a
    #: deadline): its delta counts for the steps kept, its other rows were never trained.
    #: The in-process learner loses none.
    lost: tuple[tuple[int, int], ...] = ()


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
    #: ``LearnOutcome.lost``: the sites whose update did not arrive whole, steps kept
    lost: tuple[tuple[int, int], ...] = ()

    @property
    def participants(self) -> tuple[int, ...]:
        return tuple(w.site for w in self.work)

    @property
    def contributors(self) -> tuple[int, ...]:
        """The sites whose update is in the round's model."""
        kept = dict(self.lost)
        return tuple(w.site for w in self.work if kept.get(w.site, w.steps) > 0)

    @property
    def failed(self) -> bool:
        """Sites trained, and not one update arrived: the model is unchanged."""
        return any(w.steps > 0 for w in self.work) and not self.contributors

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

    def state_dict(self) -> dict[str, Any]:
        """The record so far (a copy; ``power_logs`` and ``end_s`` are the end's): what a
        resumed run reports its rounds, evaluations and energy from. A round's rows are left
        out (trained, never read again: a restored ``SiteWork`` has none)."""
        return {
            "rounds": [
                [
                    r.index,
                    r.start_s,
                    r.train_start_s,
                    r.stop_s,
                    r.end_s,
                    r.accuracy,
                    r.loss,
                    [[w.site, w.steps, w.train_start_s, w.finish_s, w.left] for w in r.work],
                    [list(x) for x in r.lost],
                ]
                for r in self.rounds
            ],
            "evaluations": [list(e) for e in self.evaluations],
            "pauses": [list(p) for p in self.pauses],
            "rows_done": self.rows_done,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``'s value; TypeError or ValueError naming the field
        that does not fit (this run is left unchanged)."""
        where = "engine state.run"
        d = sd.fields(state, where, {"rounds", "evaluations", "pauses", "rows_done"})
        rounds = [self._round(r, f"{where}.rounds[{i}]") for i, r in enumerate(_list(d["rounds"]))]
        if [r.index for r in rounds] != list(range(1, len(rounds) + 1)):
            raise ValueError(f"{where}.rounds are not numbered 1..{len(rounds)}")
        evals = [
            _triple(e, f"{where}.evaluations[{i}]") for i, e in enumerate(_list(d["evaluations"]))
        ]
        pauses = [_pair(p, f"{where}.pauses[{i}]") for i, p in enumerate(_list(d["pauses"]))]
        rows_done = sd.integer(d["rows_done"], f"{where}.rows_done")
        assert rows_done is not None
        if not 0 <= rows_done <= self.total_rows:
            raise ValueError(f"{where}.rows_done is {rows_done}, not in 0..{self.total_rows}")
        self.rounds, self.evaluations = rounds, evals
        self.pauses = pauses
        self.rows_done = rows_done

    def _round(self, value: object, where: str) -> ElasticRound:
        v = _list(value, where)
        if len(v) != 9:
            raise ValueError(f"{where} has {len(v)} fields, not 9")
        index = sd.integer(v[0], f"{where}[0]")
        times = [sd.number(x, f"{where}[{i}]") for i, x in enumerate(v[1:7], start=1)]
        work = []
        for j, w in enumerate(_list(v[7], f"{where}.work")):
            w = _list(w, f"{where}.work[{j}]")
            if len(w) != 5 or not isinstance(w[4], bool):
                raise ValueError(f"{where}.work[{j}] is not [site, steps, start, finish, left]")
            site = sd.integer(w[0], f"{where}.work[{j}].site")
            steps = sd.integer(w[1], f"{where}.work[{j}].steps")
            assert site is not None and steps is not None
            if not 0 <= site < len(self.sites) or steps < 0:
                raise ValueError(f"{where}.work[{j}]: site {site} or steps {steps} out of range")
            start = sd.number(w[2], f"{where}.work[{j}].start")
            finish = sd.number(w[3], f"{where}.work[{j}].finish")
            assert start is not None and finish is not None
            work.append(SiteWork(site, steps, np.zeros(0, dtype=np.int64), start, finish, w[4]))
        lost = tuple(tuple(sd.integers(x, f"{where}.lost[{j}]")) for j, x in enumerate(_list(v[8])))
        if any(len(x) != 2 for x in lost):
            raise ValueError(f"{where}.lost holds an entry that is not [site, steps kept]")
        assert index is not None
        a, b, c, e, acc, loss = (float(x) for x in times)  # type: ignore[arg-type]
        return ElasticRound(index, a, b, c, e, tuple(work), acc, loss, lost)  # type: ignore[arg-type]

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


def _list(value: object, where: str = "value") -> list:
    if not isinstance(value, list):
        raise TypeError(f"{where} is {sd.kind(value)}, not a list")
    return value


def _pair(value: object, where: str) -> tuple[float, float]:
    got = sd.pair(_list(value, where), where)
    assert got is not None
    return got


def _triple(value: object, where: str) -> tuple[float, float, float]:
    got = sd.numbers(value, where)
    if len(got) != 3:
        raise ValueError(f"{where} is not (time, accuracy, loss)")
    return got[0], got[1], got[2]
