"""Curtailment-aware elastic training on an emulated clock (spec §5.2-§5.5, §5.9).

The clock moves from round to round; with no site connected it jumps to the next site's
readiness (pause). A round starts with the connected sites the policy picks; they load the
global model (``overhead_s``), then each does as many optimizer steps as its power allows. The
round is stopped by the paper's monitor rule, evaluated from ``round_min_s`` into training on:

* two or more sites connected: stop now (federated cadence);
* exactly one, and it is training in this round: keep going (solo training without
  synchronisation) until the connected set changes;
* otherwise (none connected, or the lone connected site joined mid-round): stop now.

The round also ends as soon as none of its sites is still training (all left or ran out of
data): there is nobody to wait for. A stop, like a departure, takes effect at the end of the
current step; the departing site's partial update is aggregated, weighted by its batches like
every other one. A site that becomes ready mid-round idles until the next round. Work comes from
one global data cursor, so every sample is trained on exactly once.

The learning is behind ``Learner``, so the scheduling and its accounting can be tested on their
own; ``StreamLearner`` (learner.py) trains real models.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from powertrip.curtailment.availability import SiteAvailability, change_times, connected_at
from powertrip.curtailment.carbon_greedy import CarbonSiteProfile
from powertrip.curtailment.cursor import ShardCursor
from powertrip.curtailment.emissions import IDLE_KW, TRAIN_KW, SitePowerLog
from powertrip.curtailment.wall_clock import WallClockRounds
from powertrip.rounds import policy_rng
from powertrip.selection.base import RoundContext, RoundFeedback, SelectionPolicy
from powertrip.traces.carbon import CarbonTrace


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
        """All data was trained on (B5: the run ends on data exhaustion)."""
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


class ElasticEngine:
    """One federation of sites with their availability; ``run`` plays a policy over it."""

    def __init__(
        self,
        sites: Sequence[ElasticSite],
        availability: Sequence[SiteAvailability],
        rounds: WallClockRounds,
        batch_size: int,
        horizon_s: float = math.inf,
        carbon: CarbonTrace | None = None,
        update_bytes: float = 0.0,
        eval_every_s: float = 600.0,
    ) -> None:
        if len(sites) != len(availability) or not sites:
            raise ValueError("need one availability per site, and at least one site")
        if batch_size < 1 or eval_every_s <= 0:
            raise ValueError("batch size must be >= 1 and the evaluation interval > 0 s")
        self.sites = tuple(sites)
        self.availability = tuple(availability)
        self.rounds = rounds
        self.batch = batch_size
        self.horizon_s = horizon_s
        self.carbon = carbon
        self.update_bytes = update_bytes
        self.eval_every_s = eval_every_s

    # -- the run -------------------------------------------------------------------------------
    def run(
        self,
        policy: SelectionPolicy,
        learner: Learner,
        cursor: ShardCursor,
        seed: int = 0,
        on_round: Callable[[ElasticRun], None] | None = None,
    ) -> ElasticRun:
        """Play ``policy`` until the data is used up or the horizon; ``on_round`` sees the run
        after each round (a live service reports from it)."""
        run = ElasticRun(policy.name, self.sites, cursor.total_rows)
        rng = policy_rng(seed, policy)
        accuracy, loss = learner.evaluate()
        run.evaluations.append((0.0, accuracy, loss))
        t = 0.0
        while not cursor.done and t < self.horizon_s:
            pool = connected_at(self.availability, t)
            if not pool:
                later = [a.next_ready_after(t) for a in self.availability]
                nxt = min((x for x in later if x is not None), default=None)
                if nxt is None or nxt >= self.horizon_s:
                    break
                run.pauses.append((t, nxt))
                t = nxt
                continue
            index = len(run.rounds) + 1
            chosen = self._select(policy, pool, t, index, rng)
            work, stop, end = self._play(t, chosen, cursor)
            checkpoints, times = self._checkpoints(work)
            outcome = learner.train_round(work, checkpoints)
            for at, (acc, lss) in zip(times, outcome.checkpoints, strict=True):
                run.evaluations.append((at, acc, lss))
            run.evaluations.append((end, outcome.accuracy, outcome.loss))
            run.rounds.append(
                ElasticRound(
                    index,
                    t,
                    t + self.rounds.overhead_s,
                    stop,
                    end,
                    tuple(work),
                    outcome.accuracy,
                    outcome.loss,
                )
            )
            mean_sq, sq_mean, k_eff = outcome.dispersion or (None, None, None)
            policy.observe(
                RoundFeedback(
                    index,
                    np.asarray([pool.index(i) for i in chosen], dtype=np.int64),
                    end - t,
                    outcome.accuracy,
                    accuracy,
                    mean_sq_norm=mean_sq,
                    sq_norm_of_mean=sq_mean,
                    effective_sites=k_eff,
                    loss=outcome.loss,
                    previous_loss=loss,
                )
            )
            accuracy, loss = outcome.accuracy, outcome.loss
            t = end
            run.rows_done = cursor.rows_done
            if on_round is not None:
                on_round(run)
        run.rows_done = cursor.rows_done
        run.end_s = t if cursor.done or math.isinf(self.horizon_s) else max(t, self.horizon_s)
        run.power_logs = self.power_logs(run, run.end_s)
        return run

    def _select(
        self,
        policy: SelectionPolicy,
        pool: list[int],
        t: float,
        index: int,
        rng: np.random.Generator,
    ) -> list[int]:
        sites = [self.sites[i] for i in pool]
        if self.carbon is not None:
            now = self.carbon.intensity_at(t)
            intensity = np.array([now[self.carbon.regions.index(s.region)] for s in sites])
        else:
            intensity = np.zeros(len(sites))
        profile = CarbonSiteProfile(
            power=np.array([s.power for s in sites]),
            comm_s=np.array([s.comm_s for s in sites]),
            distance_mi=np.array([s.distance_mi for s in sites]),
            intensity=intensity,
        )
        ctx = RoundContext(index, t, profile, self.rounds.round_min_s, self.update_bytes, rng)
        picked = sorted({int(j) for j in policy.select(ctx)})
        if not picked:
            raise RuntimeError(f"policy {policy.name} selected no site in round {index}")
        return [pool[j] for j in picked]

    # -- one round -----------------------------------------------------------------------------
    def _play(
        self, t0: float, chosen: list[int], cursor: ShardCursor
    ) -> tuple[list[SiteWork], float, float]:
        ts = t0 + self.rounds.overhead_s
        shards = cursor.deal([self.sites[i].name for i in chosen])
        step, leave, data_end, cap = {}, {}, {}, {}
        for i in chosen:
            step[i] = self.rounds.step_time_s(self.sites[i].power)
            episode = self.availability[i].episode_at(t0)
            leave[i] = episode.end_s if episode is not None else t0
            cap[i] = math.ceil(cursor.remaining(shards[self.sites[i].name]) / self.batch)
            data_end[i] = ts + cap[i] * step[i]
        stop = self._stop_time(ts, chosen, leave, data_end)
        work = []
        for i in chosen:
            name = self.sites[i].name
            steps = min(self.rounds.steps_by(min(stop, leave[i]) - ts, step[i]), cap[i])
            rows = min(steps * self.batch, cursor.remaining(shards[name]))
            work.append(
                SiteWork(
                    i,
                    steps,
                    cursor.take(shards[name], rows),
                    ts,
                    ts + steps * step[i],
                    left=leave[i] <= stop,
                )
            )
        uploads = [w.finish_s + self.sites[w.site].comm_s for w in work if w.steps > 0]
        return work, stop, max([stop, *uploads])

    def _stop_time(
        self,
        ts: float,
        chosen: list[int],
        leave: dict[int, float],
        data_end: dict[int, float],
    ) -> float:
        def training(t: float) -> list[int]:
            return [i for i in chosen if t < leave[i] and t < data_end[i]]

        def monitor_stops(t: float) -> bool:
            busy = training(t)
            if not busy:
                return True
            connected = connected_at(self.availability, t)
            return len(connected) != 1 or connected[0] not in busy

        nobody_left = max(min(leave[i], data_end[i]) for i in chosen)
        first = ts + self.rounds.round_min_s
        if nobody_left <= first:
            return min(nobody_left, self.horizon_s)
        later = set(change_times(self.availability, first)) | set(data_end.values())
        for t in [first, *sorted(x for x in later if x > first)]:
            if t >= self.horizon_s:
                return self.horizon_s
            if monitor_stops(t):
                return t
        return min(nobody_left, self.horizon_s)

    def _checkpoints(self, work: list[SiteWork]) -> tuple[Checkpoints | None, list[float]]:
        """Every ``eval_every_s`` of solo training (a solo round, or the remainder of a round
        after its other sites left): the checkpoints and their times."""
        active = [w for w in work if w.steps > 0]
        if not active:
            return None, []
        last = max(active, key=lambda w: w.finish_s)
        others_done = max((w.finish_s for w in active if w is not last), default=0.0)
        step = self.rounds.step_time_s(self.sites[last.site].power)
        every = max(1, math.ceil(self.eval_every_s / step - 1e-9))
        steps = [
            k
            for k in range(every, last.steps, every)
            if last.train_start_s + k * step >= others_done
        ]
        times = [last.train_start_s + k * step for k in steps]
        return (Checkpoints(last.site, tuple(steps)) if steps else None), times

    # -- energy --------------------------------------------------------------------------------
    def power_logs(self, run: ElasticRun, until_s: float) -> list[SitePowerLog]:
        """When each site was powered and trained, up to ``until_s`` (the run's end, or now)."""
        logs = []
        for i, (site, avail) in enumerate(zip(self.sites, self.availability, strict=True)):
            log = SitePowerLog(site.name, site.region, site.train_kw, site.idle_kw)
            for e in avail.episodes:
                a, b = e.provisioned_s, min(e.end_s, until_s)
                if a < b:
                    log.on.append((a, b))
            for r in run.rounds:
                for w in r.work:
                    if w.site == i and w.steps > 0:
                        log.training.append((w.train_start_s, w.finish_s))
            logs.append(log)
        return logs
