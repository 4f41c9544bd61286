"""What ``GetStatus`` reports of a run, either mode: its state, its latest rounds (a bounded
history, paged out), and a consistent snapshot of both for the servicer."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum

from powertrip.curtailment.emissions import EnergyReport
from powertrip.rounds.loop import RoundRecord
from powertrip.v1 import aggregator_pb2

#: the rounds the status holds (the latest; older ones are in the logs, metrics, checkpoints):
#: its memory and a snapshot's cost do not grow with the run
HISTORY = 10_000


class RunState(IntEnum):  # values match powertrip.v1.RunState
    WAITING_FOR_SITES = 1
    TRAINING = 2
    DONE = 3
    FAILED = 4


#: the state as GetStatus sends it (the wire enum)
WIRE_STATE: dict[RunState, aggregator_pb2.RunState] = {
    RunState.WAITING_FOR_SITES: aggregator_pb2.RUN_STATE_WAITING_FOR_SITES,
    RunState.TRAINING: aggregator_pb2.RUN_STATE_TRAINING,
    RunState.DONE: aggregator_pb2.RUN_STATE_DONE,
    RunState.FAILED: aggregator_pb2.RUN_STATE_FAILED,
}


@dataclass(frozen=True)
class StatusRound:
    """A finished round as the status reports it."""

    record: RoundRecord
    start_s: float = 0.0  # curtailment mode: the clock when the round began
    steps: tuple[int, ...] = ()  # curtailment mode: local steps of each selected site


@dataclass
class RunStatus:
    """The run's progress; written by the run's thread under the lifecycle's lock."""

    state: RunState = RunState.WAITING_FOR_SITES
    round: int = 0
    accuracy: float = 0.0
    clock_s: float = 0.0
    time_to_accuracy_s: float | None = None
    message: str = ""
    # the latest HISTORY rounds (a snapshot's: one page of them), and how many were recorded
    rounds: deque[StatusRound] | list[StatusRound] = field(
        default_factory=lambda: deque(maxlen=HISTORY)
    )
    total_rounds: int = 0
    mode: str = ""  # curtailment mode: "pause", "solo" or "federated"
    active_sites: int = 0
    energy: EnergyReport | None = None  # curtailment mode: energy and emissions so far


@dataclass(frozen=True)
class StatusSnapshot:
    """A consistent copy of the status plus the run's fixed facts, for ``GetStatus``."""

    status: RunStatus  # a copy: its ``rounds`` are one page of the held rounds, a list
    target: float | None
    registered_sites: int
    expected_sites: int
    policy: str
    clock: str
    first_round: int = 0  # the oldest round held (0: none)
    more_rounds: bool = False  # held rounds past the page
