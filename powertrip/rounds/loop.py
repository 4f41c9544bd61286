"""The round loop, shared by the emulator and the aggregator service.

Each round: read site profiles at the clock's time, let the policy pick sites, have an executor
train them and fold their updates, advance the clock, feed the outcome back to the policy. The
executor is the only thing that differs: in-process training in the emulator, a fan-out over gRPC
to real workers in the aggregator service. Both therefore make the same decisions for the same
seed, and time-to-accuracy is read from whichever clock the run uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ParamSpec, Protocol

import numpy as np
from numpy.typing import NDArray

from powertrip import state_dict as sd
from powertrip.config.sites import RoundTimeModel
from powertrip.rounds.clock import Clock, EmulatedClock
from powertrip.rounds.reported import bound_losses
from powertrip.selection.base import RoundContext, RoundFeedback, SelectionPolicy
from powertrip.sites.forecast import Forecaster, compute_times_s
from powertrip.sites.profiles import PowerSource, SiteProfile
from powertrip.sites.timing import centralized_round_time_s, round_time_s

P = ParamSpec("P")


@dataclass(frozen=True)
class TimeModel:
    ideal_compute_s: float  # tau, local training at 100% power
    update_bytes: float
    ground_truth: RoundTimeModel = RoundTimeModel.PER_SITE_MAX
    round_trip: bool = False
    #: set (``round_power="integrated"``): each site computes at the power it has as the round
    #: goes on, read from this source; None: at its power when the round starts (the paper's)
    power: PowerSource | None = None


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
    half_params: Any = None  # the split-half model while its evaluation is deferred (emulator)
    outer_state: Any = None  # the outer optimizer's momentum after the round (outer_step.py)
    #: the aggregation rule's state after the round (``robust.AdaptiveBound``; None for a rule
    #: without one) and its decisions this round: updates dropped (zeroed) and clipped
    aggregation_state: Any = None
    dropped: int = 0
    clipped: int = 0
    #: each selected site's mean training loss and sample count n_i, in selection order (the
    #: emulator fills them; Oort's statistical utility reads them); None where not measured
    site_loss: Any = None
    site_samples: Any = None


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

        None means the round failed (no update arrived, or too few; or ``selected`` is empty
        because no selected site was available): the global model is unchanged.
        """
        ...


class MeasuredRound(Protocol):
    """What a policy learns from a finished round, in either mode: ``RoundOutcome`` here, the
    curtailment engine's ``LearnOutcome`` (which measures no probes). Read-only members, so
    frozen dataclasses satisfy it."""

    @property
    def accuracy(self) -> float: ...
    @property
    def loss(self) -> float: ...
    @property
    def dispersion(self) -> tuple[float, float, float] | None: ...
    @property
    def projection(self) -> tuple[float, float] | None: ...
    @property
    def half_loss(self) -> float | None: ...
    @property
    def half_sites(self) -> float | None: ...
    @property
    def half_accuracy(self) -> float | None: ...


@dataclass(frozen=True)
class SiteFeedback(RoundFeedback):
    """``RoundFeedback`` with per-site measurements, in the order of ``selected``: each site's
    mean local training loss and its sample count n_i (None where the executor measured none).
    Policies that never read them (every one but the utility-driven baselines) see the same
    ``RoundFeedback`` fields as before."""

    site_loss: NDArray[np.float64] | None = None
    site_samples: NDArray[np.float64] | None = None


def round_feedback(
    index: int,
    selected: NDArray[np.int64],
    duration_s: float,
    outcome: MeasuredRound,
    previous_accuracy: float,
    previous_loss: float,
) -> RoundFeedback:
    """The one way both round loops tell a policy how its round went (Algorithm 1 measures the
    accuracy gain and the round time of the sites it chose)."""
    mean_sq, sq_mean, k_eff = outcome.dispersion or (None, None, None)
    mean_proj, mean_sq_proj = outcome.projection or (None, None)
    return SiteFeedback(
        index,
        selected,
        duration_s,
        outcome.accuracy,
        previous_accuracy,
        mean_sq_norm=mean_sq,
        sq_norm_of_mean=sq_mean,
        effective_sites=k_eff,
        loss=outcome.loss,
        previous_loss=previous_loss,
        half_loss=outcome.half_loss,
        half_sites=outcome.half_sites,
        half_accuracy=outcome.half_accuracy,
        mean_proj=mean_proj,
        mean_sq_proj=mean_sq_proj,
        # a peer's claims, bounded by the evaluated loss before any policy reads them
        site_loss=bound_losses(getattr(outcome, "site_loss", None), outcome.loss).values,
        site_samples=getattr(outcome, "site_samples", None),
    )


def policy_rng(seed: int, policy: SelectionPolicy) -> np.random.Generator:
    """The policy's own random stream (random-k), fixed by the run seed and the policy name."""
    return np.random.default_rng([seed, int.from_bytes(policy.name.encode()[:8], "big")])


def round_duration_s(
    time_model: TimeModel,
    policy: SelectionPolicy,
    profile: SiteProfile,
    selected: NDArray,
    started_s: float | None = None,
) -> float:
    """The emulated clock's length of a round: the time model's ground truth (the slowest selected
    site, Eq. 4, or Eq. 7's aggregate), or tau / P for a centralized baseline."""
    if policy.centralized_power is not None:
        return centralized_round_time_s(time_model.ideal_compute_s, policy.centralized_power)
    power = profile.power[selected]
    if time_model.power is not None and started_s is not None:
        # the power that does the work tau in the time the sites really take: tau / T_i
        tau = time_model.ideal_compute_s
        power = tau / compute_times_s(time_model.power, started_s, tau, selected)
    return round_time_s(
        time_model.ground_truth,
        time_model.ideal_compute_s,
        power,
        profile.comm_s[selected],
        total_sites=profile.size,
    )


class RoundLoop:
    """The round loop with what it carries from one round to the next (the round reached, the
    last accuracy and loss the policy compares with, the initial evaluation, the policy's random
    stream and the clock) as a ``state_dict()``: a loop built from the same configuration and
    given that state (``load_state_dict``), with the policy given its own, runs the rounds that
    follow exactly as the uninterrupted loop would. A checkpoint holds both, so a resume needs no
    history.

    ``on_round`` is called once a round is fully accounted for: ``state_dict()`` then holds it.
    """

    def __init__(
        self,
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
        forecast: Forecaster | None = None,
    ) -> None:
        self.policy, self.executor, self.profile_at = policy, executor, profile_at
        self.time_model, self.clock, self.seed = time_model, clock, seed
        self.target_accuracy, self.max_rounds = target_accuracy, max_rounds
        self.on_round, self.should_stop, self.forecast = on_round, should_stop, forecast
        self.rng = policy_rng(seed, policy)
        self.round = 0  # the last round run
        self.initial: tuple[float, float] | None = None  # (accuracy, loss) before round 1
        self.accuracy = self.loss = 0.0  # after the last round that completed

    def state_dict(self) -> dict[str, Any]:
        """The loop's carry (plain numbers; the generator's state is a dict of ints), a copy."""
        return {
            "round": self.round,
            "accuracy": float(self.accuracy),
            "loss": float(self.loss),
            "initial": None if self.initial is None else [float(v) for v in self.initial],
            "rng": sd.generator_state(self.rng),
            "clock_s": float(self.clock.now()),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after ``state``'s round; TypeError or ValueError naming a field that does
        not fit (this loop is left unchanged)."""
        where = "loop state"
        d = sd.fields(state, where, {"round", "accuracy", "loss", "initial", "rng", "clock_s"})
        r = sd.integer(d["round"], f"{where}.round")
        assert r is not None
        if not 0 <= r <= self.max_rounds:
            raise ValueError(f"{where}.round is {r}, not one of 0..{self.max_rounds}")
        accuracy = sd.number(d["accuracy"], f"{where}.accuracy")
        loss = sd.number(d["loss"], f"{where}.loss")
        initial = sd.pair(d["initial"], f"{where}.initial")
        clock_s = sd.number(d["clock_s"], f"{where}.clock_s")
        assert clock_s is not None
        if not 0 <= clock_s < float("inf"):
            raise ValueError(f"{where}.clock_s is {clock_s}, not a time")
        rng = policy_rng(self.seed, self.policy)
        sd.load_generator_state(rng, d["rng"], f"{where}.rng")
        resume_at = getattr(self.clock, "resume_at", None)
        if resume_at is None:
            raise ValueError(f"a {type(self.clock).__name__} cannot be resumed")
        resume_at(clock_s)
        self.round, self.rng, self.initial = r, rng, initial
        self.accuracy, self.loss = accuracy, loss  # type: ignore[assignment]

    @property
    def done(self) -> bool:
        """The round budget spent or the target reached: nothing left to run."""
        reached = self.target_accuracy is not None and self.round > 0
        reached = reached and self.accuracy >= self.target_accuracy  # type: ignore[operator]
        return self.round >= self.max_rounds or reached

    def run(self) -> RunResult:
        """Run the rounds after ``self.round`` (see ``run_rounds``); the result holds those."""
        policy, executor = self.policy, self.executor
        clock, time_model = self.clock, self.time_model
        if self.initial is None:
            self.initial = executor.evaluate_initial()
            self.accuracy, self.loss = self.initial
        target, max_rounds = self.target_accuracy, self.max_rounds
        result = RunResult(policy.name, self.seed, target, initial_accuracy=self.initial[0])
        split_half = policy.wants_split_half
        while not self.done:
            if self.should_stop is not None and self.should_stop():
                break
            r = self.round + 1
            started = clock.now()
            profile = self.profile_at(started)
            ranked = profile.for_ranking()
            ctx = RoundContext(
                r,
                started,
                ranked,
                time_model.ideal_compute_s,
                time_model.update_bytes,
                self.rng,
                self.forecast,
                target,
                max_rounds - r + 1,
            )
            selected = np.asarray(policy.select(ctx), dtype=np.int64)
            if selected.size == 0:
                raise RuntimeError(f"policy {policy.name} selected no site in round {r}")
            # Unavailable sites never train; none left: the executor fails the round untrained.
            selected = profile.keep_available(selected)
            outcome = executor.execute(r, selected, profile, split_half)
            if isinstance(clock, EmulatedClock) and selected.size:
                clock.advance(round_duration_s(time_model, policy, profile, selected, started))
            duration = clock.now() - started
            ids = tuple(int(i) for i in selected)
            accuracy, loss = self.accuracy, self.loss
            if outcome is None:
                record = RoundRecord(
                    r, clock.now(), duration, len(ids), accuracy, loss, ids, 0, "failed"
                )
            else:
                policy.observe(round_feedback(r, selected, duration, outcome, accuracy, loss))
                self.accuracy, self.loss = outcome.accuracy, outcome.loss
                record = RoundRecord(
                    r,
                    clock.now(),
                    duration,
                    len(ids),
                    self.accuracy,
                    self.loss,
                    ids,
                    outcome.contributions,
                )
            self.round = r
            result.rounds.append(record)
            if self.on_round is not None:
                self.on_round(record)
        return result


def _run_once(loop: Callable[P, RoundLoop]) -> Callable[P, RunResult]:
    """``run_rounds``: a ``loop`` built from the arguments and run once; its parameters are the
    loop's own, declared once (``RoundLoop.__init__``), and typed so."""

    def run_rounds(*args: P.args, **kwargs: P.kwargs) -> RunResult:
        """Run until the target accuracy (if any), the round budget, or ``should_stop()``; takes
        ``RoundLoop``'s arguments.

        With an ``EmulatedClock`` a round lasts its modelled time; with any other clock it lasts
        what the clock measured while the executor worked.

        A profile's ``available`` mask (the aggregator's worker leases) is honoured twice: the
        policy ranks unavailable sites last (``SiteProfile.for_ranking``), and any it still picks
        are dropped from the round. With no site left the executor gets an empty selection and must
        fail the round without training (the emulated clock does not move). Without a mask nothing
        changes.

        ``forecast`` (``powertrip.sites.forecast``) is handed to the policy in every RoundContext. A
        run that must be resumable builds a ``RoundLoop`` itself and keeps its ``state_dict()``.
        """
        return loop(*args, **kwargs).run()

    return run_rounds


run_rounds = _run_once(RoundLoop)
