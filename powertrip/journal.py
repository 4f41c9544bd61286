"""The round journal: what a restarted aggregator replays through the round loop so that the
policy (and its random stream) resumes in exactly the state it had at the checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from powertrip.rounds import RoundExecutor, RoundOutcome
from powertrip.sites import SiteProfile


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
