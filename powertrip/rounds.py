"""The round loop, shared by the emulator and the aggregator service.

Each round: read site profiles at the clock's time, let the policy pick sites, have an executor
train them and fold their updates, advance the clock, feed the outcome back to the policy. The
executor is the only thing that differs: in-process training in the emulator, a fan-out over gRPC
to real workers in the aggregator service. Both therefore make the same decisions for the same
seed, and time-to-accuracy is read from whichever clock the run uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from powertrip.clock import Clock, EmulatedClock
from powertrip.selection.base import RoundContext, RoundFeedback, SelectionPolicy
from powertrip.sites import SiteProfile
from powertrip.timing import RoundTimeModel, centralized_round_time_s, round_time_s


@dataclass(frozen=True)
class TimeModel:
    ideal_compute_s: float  # tau, local training at 100% power
    update_bytes: float
    ground_truth: RoundTimeModel = RoundTimeModel.PER_SITE_MAX
    round_trip: bool = False


@dataclass(frozen=True)
class RoundRecord:
    round: int
    time_s: float  # clock at the end of the round
    duration_s: float
    sites: int
    accuracy: float
    loss: float
    selected: tuple[int, ...] = ()
    contributions: int = 0  # updates folded; < sites when a worker failed or was rejected
    outcome: str = "completed"  # or "failed": nothing arrived, the model is unchanged


@dataclass
class RunResult:
    policy: str
    seed: int
    target_accuracy: float | None
    rounds: list[RoundRecord] = field(default_factory=list)
    initial_accuracy: float = 0.0

    def time_to(self, target: float) -> float | None:
        """Clock seconds until the first round whose accuracy reaches ``target``."""
        for r in self.rounds:
            if r.accuracy >= target:
                return r.time_s
        return None

    def rounds_to(self, target: float) -> int | None:
        for r in self.rounds:
            if r.accuracy >= target:
                return r.round
        return None


@dataclass(frozen=True)
class RoundOutcome:
    """What an executor reports after training and folding one round."""

    accuracy: float
    loss: float
    dispersion: tuple[float, float, float]  # StreamingFedAvg.dispersion()
    contributions: int
    half_loss: float | None = None  # split-half probe, when requested
    half_sites: float | None = None
    params: Any = None  # the new global model, in the executor's own representation
    # StreamingFedAvg.projection(): the updates' dispersion along the previous global delta
    projection: tuple[float, float] | None = None
    half_accuracy: float | None = None  # split-half probe: accuracy of the half average


class RoundExecutor(Protocol):
    def evaluate_initial(self) -> tuple[float, float]:
        """(accuracy, loss) of the starting model."""
        ...

    def execute(
        self,
        round_index: int,
        selected: NDArray[np.int64],
        profile: SiteProfile,
        split_half: bool,
    ) -> RoundOutcome | None:
        """Train ``selected`` from the current global model and commit the FedAvg result.

        None means the round failed (no update arrived): the global model is unchanged.
        """
        ...


def policy_rng(seed: int, policy: SelectionPolicy) -> np.random.Generator:
    """The policy's own random stream (random-k), fixed by the run seed and the policy name."""
    return np.random.default_rng([seed, int.from_bytes(policy.name.encode()[:8], "big")])


def round_duration_s(
    time_model: TimeModel, policy: SelectionPolicy, profile: SiteProfile, selected: NDArray
) -> float:
    """The emulated clock's length of a round (spec §4.2 ground truth)."""
    if policy.centralized_power is not None:
        return centralized_round_time_s(time_model.ideal_compute_s, policy.centralized_power)
    return round_time_s(
        time_model.ground_truth,
        time_model.ideal_compute_s,
        profile.power[selected],
        profile.comm_s[selected],
        total_sites=profile.size,
    )


def run_rounds(
    policy: SelectionPolicy,
    executor: RoundExecutor,
    profile_at: Callable[[float], SiteProfile],
    time_model: TimeModel,
    clock: Clock,
    seed: int,
    target_accuracy: float | None,
    max_rounds: int,
    on_round: Callable[[RoundRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> RunResult:
    """Run until the target accuracy (if any), the round budget, or ``should_stop()``.

    With an ``EmulatedClock`` a round lasts its modelled time; with any other clock it lasts
    what the clock measured while the executor worked.
    """
    rng = policy_rng(seed, policy)
    accuracy, loss = executor.evaluate_initial()
    result = RunResult(policy.name, seed, target_accuracy, initial_accuracy=accuracy)
    split_half = policy.wants_split_half
    for r in range(1, max_rounds + 1):
        if should_stop is not None and should_stop():
            break
        started = clock.now()
        profile = profile_at(started)
        ctx = RoundContext(
            r, started, profile, time_model.ideal_compute_s, time_model.update_bytes, rng
        )
        selected = np.asarray(policy.select(ctx), dtype=np.int64)
        if selected.size == 0:
            raise RuntimeError(f"policy {policy.name} selected no site in round {r}")
        outcome = executor.execute(r, selected, profile, split_half)
        if isinstance(clock, EmulatedClock):
            clock.advance(round_duration_s(time_model, policy, profile, selected))
        duration = clock.now() - started
        ids = tuple(int(i) for i in selected)
        if outcome is None:
            record = RoundRecord(
                r, clock.now(), duration, len(ids), accuracy, loss, ids, 0, "failed"
            )
        else:
            mean_sq, sq_mean, k_eff = outcome.dispersion
            mean_proj, mean_sq_proj = outcome.projection or (None, None)
            policy.observe(
                RoundFeedback(
                    r,
                    selected,
                    duration,
                    outcome.accuracy,
                    accuracy,
                    mean_sq_norm=mean_sq,
                    sq_norm_of_mean=sq_mean,
                    effective_sites=k_eff,
                    loss=outcome.loss,
                    previous_loss=loss,
                    half_loss=outcome.half_loss,
                    half_sites=outcome.half_sites,
                    half_accuracy=outcome.half_accuracy,
                    mean_proj=mean_proj,
                    mean_sq_proj=mean_sq_proj,
                )
            )
            accuracy, loss = outcome.accuracy, outcome.loss
            record = RoundRecord(
                r, clock.now(), duration, len(ids), accuracy, loss, ids, outcome.contributions
            )
        result.rounds.append(record)
        if on_round is not None:
            on_round(record)
        if target_accuracy is not None and accuracy >= target_accuracy:
            break
    return result


@dataclass(frozen=True)
class JournalEntry:
    """One round as the policy saw it: enough to replay the policy's state after a restart."""

    round: int
    selected: tuple[int, ...]
    outcome: RoundOutcome | None  # params dropped: the checkpoint holds the model

    def to_json(self) -> dict[str, Any]:
        o = self.outcome
        return {
            "round": self.round,
            "selected": list(self.selected),
            "outcome": None
            if o is None
            else {
                "accuracy": o.accuracy,
                "loss": o.loss,
                "dispersion": list(o.dispersion),
                "contributions": o.contributions,
                "half_loss": o.half_loss,
                "half_sites": o.half_sites,
                "projection": None if o.projection is None else list(o.projection),
                "half_accuracy": o.half_accuracy,
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JournalEntry:
        o = data["outcome"]
        outcome = None
        if o is not None:
            outcome = RoundOutcome(
                o["accuracy"],
                o["loss"],
                tuple(o["dispersion"]),
                o["contributions"],
                o["half_loss"],
                o["half_sites"],
                projection=tuple(o["projection"]) if o.get("projection") else None,
                half_accuracy=o.get("half_accuracy"),
            )
        return cls(int(data["round"]), tuple(data["selected"]), outcome)


class JournaledExecutor:
    """Wraps an executor: records every round, and replays recorded rounds without training.

    Restarting from a checkpoint replays the journal through the same loop, so the policy (and
    its random stream) reaches exactly the state it had when the checkpoint was written; with
    deterministic training the resumed run then equals an uninterrupted one.
    """

    def __init__(
        self,
        live: RoundExecutor,
        journal: list[JournalEntry] | None = None,
        initial: tuple[float, float] | None = None,
    ) -> None:
        self.live = live
        self.journal = list(journal or [])
        self._replay = len(self.journal)
        self.initial = initial

    def replaying(self, round_index: int) -> bool:
        return round_index <= self._replay

    def evaluate_initial(self) -> tuple[float, float]:
        if self.initial is None:
            self.initial = self.live.evaluate_initial()
        return self.initial

    def execute(
        self,
        round_index: int,
        selected: NDArray[np.int64],
        profile: SiteProfile,
        split_half: bool,
    ) -> RoundOutcome | None:
        ids = tuple(int(s) for s in selected)
        if self.replaying(round_index):
            entry = self.journal[round_index - 1]
            if entry.selected != ids:
                raise RuntimeError(
                    f"cannot resume: round {round_index} selects {list(ids)} now but "
                    f"{list(entry.selected)} before the restart (configuration changed?)"
                )
            return entry.outcome
        outcome = self.live.execute(round_index, selected, profile, split_half)
        kept = None if outcome is None else replace(outcome, params=None)
        self.journal.append(JournalEntry(round_index, ids, kept))
        return outcome
