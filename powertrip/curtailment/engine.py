"""Curtailment-aware elastic training on an emulated clock (arXiv 2602.22760, inside PowerTrip's
round loop vocabulary).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from powertrip import state_dict as sd
from powertrip.curtailment.availability import SiteAvailability, change_times, connected_at
from powertrip.curtailment.cursor import ShardCursor
from powertrip.curtailment.emissions import SitePowerLog
from powertrip.curtailment.run_model import (
    Checkpoints,
    ElasticRound,
    ElasticRun,
    ElasticSite,
    Learner,
    SiteWork,
)
from powertrip.curtailment.wall_clock import WallClockRounds
from powertrip.rounds.loop import policy_rng, round_feedback
from powertrip.selection.base import RoundContext, SelectionPolicy
from powertrip.selection.carbon_greedy import CarbonSiteProfile
from powertrip.traces.carbon import CarbonTrace


@dataclass
class ElasticState:
    """What the engine carries from one round to the next besides the policy, the learner and
    the cursor (each has its own state): the record so far, the policy's random stream, the
    clock and the current model's evaluation. ``state_dict`` / ``load_state_dict`` are a
    checkpoint's form of it (PyTorch's shape: plain values, copies)."""

    run: ElasticRun
    rng: np.random.Generator
    t: float = 0.0
    accuracy: float = 0.0
    loss: float = 0.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "run": self.run.state_dict(),
            "rng": sd.generator_state(self.rng),
            "t": self.t,
            "accuracy": self.accuracy,
            "loss": self.loss,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """TypeError or ValueError naming the field that does not fit (left unchanged)."""
        where = "engine state"
        d = sd.fields(state, where, {"run", "rng", "t", "accuracy", "loss"})
        t, acc, loss = (sd.number(d[k], f"{where}.{k}") for k in ("t", "accuracy", "loss"))
        assert t is not None and acc is not None and loss is not None
        if not 0 <= t < math.inf:
            raise ValueError(f"{where}.t is {t}, not a clock time")
        rng = np.random.default_rng()
        rng.bit_generator.state = self.rng.bit_generator.state
        sd.load_generator_state(rng, d["rng"], f"{where}.rng")
        run = ElasticRun(self.run.policy, self.run.sites, self.run.total_rows)
        run.load_state_dict(d["run"])
        self.run, self.rng, self.t, self.accuracy, self.loss = run, rng, t, acc, loss


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
    def start(
        self, policy: SelectionPolicy, learner: Learner, cursor: ShardCursor, seed: int = 0
    ) -> ElasticState:
        """A run's first state: clock 0, the initial model evaluated, the policy's stream."""
        run = ElasticRun(policy.name, self.sites, cursor.total_rows)
        state = ElasticState(run, policy_rng(seed, policy))
        state.accuracy, state.loss = learner.evaluate()
        state.run.evaluations.append((0.0, state.accuracy, state.loss))
        return state

    def run(
        self,
        policy: SelectionPolicy,
        learner: Learner,
        cursor: ShardCursor,
        seed: int = 0,
        on_round: Callable[[ElasticRun], None] | None = None,
        state: ElasticState | None = None,
    ) -> ElasticRun:
        """Play ``policy`` until the data is used up or the horizon; ``on_round`` sees the run
        after each round (a live service reports and checkpoints from it). ``state``: where to
        go on from (``start``'s, or a checkpoint's, with the policy, learner and cursor of the
        same moment); None: from the start."""
        st = state if state is not None else self.start(policy, learner, cursor, seed)
        run = st.run
        while not cursor.done and st.t < self.horizon_s:
            t = st.t
            pool = connected_at(self.availability, t)
            if not pool:
                later = [a.next_ready_after(t) for a in self.availability]
                nxt = min((x for x in later if x is not None), default=None)
                if nxt is None or nxt >= self.horizon_s:
                    break
                run.pauses.append((t, nxt))
                st.t = nxt
                continue
            index = len(run.rounds) + 1
            chosen = self._select(policy, pool, t, index, st.rng)
            work, stop, end = self._play(t, chosen, cursor)
            checkpoints, times = self._checkpoints(work)
            outcome = learner.train_round(work, checkpoints)
            for site, kept in outcome.lost:  # never trained: back to the pool
                w = next(w for w in work if w.site == site)
                cursor.give_back(w.rows[kept * self.batch :])
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
                    outcome.lost,
                )
            )
            picked = np.asarray([pool.index(i) for i in chosen], dtype=np.int64)
            policy.observe(round_feedback(index, picked, end - t, outcome, st.accuracy, st.loss))
            st.accuracy, st.loss = outcome.accuracy, outcome.loss
            st.t = end
            run.rows_done = cursor.rows_done
            if on_round is not None:
                on_round(run)
        t = st.t
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
