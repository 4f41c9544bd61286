"""The round journal: the run's history, one entry per round (the sites chosen and down, what
the round measured, the clock), for ``GetStatus``, plots and audits. Nothing resumes from it: a
checkpoint holds every state a resume needs (``state_dict``), so a damaged journal costs
history, never a round (R34)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from powertrip.rounds.loop import RoundExecutor, RoundOutcome, RoundRecord
from powertrip.sites.profiles import SiteProfile


@dataclass(frozen=True)
class JournalEntry:
    """One round as the policy saw it and as the status reports it."""

    round: int
    selected: tuple[int, ...]
    outcome: RoundOutcome | None  # params dropped: the checkpoint holds the model
    unavailable: tuple[int, ...] = ()  # the sites that were down (the mask the policy saw)
    time_s: float | None = None  # the run's clock at the end of the round (None: not recorded)
    duration_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        o = self.outcome
        down = {"unavailable": list(self.unavailable)} if self.unavailable else {}
        clock = {} if self.time_s is None else {"time_s": self.time_s}
        clock |= {} if self.duration_s is None else {"duration_s": self.duration_s}
        return {
            "round": self.round,
            "selected": list(self.selected),
            **down,
            **clock,
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
    def from_json(cls, data: object, where: str = "journal entry") -> JournalEntry:
        """The entry ``to_json`` wrote. Every field is type-checked, never converted (a replay
        must feed the policy exactly what it saw): TypeError naming the field (``where``, e.g.
        ``journal.jsonl line 7``) when one is not what ``to_json`` writes, so a damaged or
        forged checkpoint is refused at load instead of crashing the run when replayed."""
        d = _fields(
            data, where, {"round", "selected", "outcome", "unavailable", "time_s", "duration_s"}
        )
        for key in ("round", "selected", "outcome"):
            if key not in d:
                raise TypeError(f"{where} has no {key}")
        r, sel, down = d["round"], d["selected"], d.get("unavailable", [])
        if not _is_int(r):
            raise TypeError(f"{where}: round is {_kind(r)}, not an integer")
        for key, sites in (("selected", sel), ("unavailable", down)):
            if not isinstance(sites, list) or not all(_is_int(s) for s in sites):
                raise TypeError(f"{where}: {key} is {_kind(sites)}, not a list of site integers")
        for key in ("time_s", "duration_s"):
            if key in d and not _is_number(d[key]):
                raise TypeError(f"{where}: {key} is {_kind(d[key])}, not a number")
        clock = (d.get("time_s"), d.get("duration_s"))
        o = d["outcome"]
        if o is None:
            return cls(r, tuple(sel), None, tuple(down), *clock)
        where = f"{where}: outcome"
        o = _fields(o, where, set(_NUMBERS) | {"dispersion", "contributions"})
        for key, optional in _NUMBERS.items():
            if (
                key != "projection"
                and key in o
                and not (_is_number(o[key]) or (optional and o[key] is None))
            ):
                raise TypeError(f"{where}.{key} is {_kind(o[key])}, not a number")
        for key in ("accuracy", "loss", "dispersion", "contributions"):
            if key not in o:
                raise TypeError(f"{where} has no {key}")
        if not _is_int(o["contributions"]):
            raise TypeError(f"{where}.contributions is {_kind(o['contributions'])}, not an integer")
        _numbers(o["dispersion"], f"{where}.dispersion", 3)
        projection = o.get("projection")
        if projection is not None:
            _numbers(projection, f"{where}.projection", 2)
        outcome = RoundOutcome(
            o["accuracy"],
            o["loss"],
            tuple(o["dispersion"]),
            o["contributions"],
            o.get("half_loss"),
            o.get("half_sites"),
            projection=tuple(projection) if projection else None,
            half_accuracy=o.get("half_accuracy"),
        )
        return cls(r, tuple(sel), outcome, tuple(down), *clock)

    def record(self, previous: tuple[float, float]) -> RoundRecord:
        """The round as the status reports it; ``previous``: (accuracy, loss) before it, which
        a failed round keeps."""
        o = self.outcome
        accuracy, loss = previous if o is None else (o.accuracy, o.loss)
        return RoundRecord(
            self.round,
            self.time_s or 0.0,
            self.duration_s or 0.0,
            len(self.selected),
            accuracy,
            loss,
            self.selected,
            0 if o is None else o.contributions,
            "failed" if o is None else "completed",
        )


#: the outcome's number fields, and whether each may be null
_NUMBERS = {"accuracy": False, "loss": False, "half_loss": True, "half_sites": True}
_NUMBERS |= {"half_accuracy": True, "projection": True}  # projection: a list, checked apart


def _kind(value: object) -> str:
    name = type(value).__name__
    return "null" if value is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fields(data: object, where: str, allowed: set[str]) -> dict[str, Any]:
    """``data`` as an object whose keys are among ``allowed`` (extra keys: TypeError)."""
    if not isinstance(data, dict):
        raise TypeError(f"{where} is {_kind(data)}, not an object")
    extra = set(data) - allowed
    if extra:
        raise TypeError(f"{where} has unknown fields {sorted(extra)}")
    return data


def _numbers(value: object, where: str, length: int) -> None:
    if not isinstance(value, list) or len(value) != length or not all(map(_is_number, value)):
        raise TypeError(f"{where} is {_kind(value)}, not a list of {length} numbers")


class JournaledExecutor:
    """Wraps an executor and records every round it runs (params dropped), for the journal
    file: ``take_new`` hands over the rounds recorded since its last call, so memory does not
    grow with the run."""

    def __init__(self, live: RoundExecutor) -> None:
        self.live = live
        self._new: list[JournalEntry] = []

    def take_new(self) -> list[JournalEntry]:
        """The rounds executed since the last call, in order; forgotten here."""
        new, self._new = self._new, []
        return new

    def evaluate_initial(self) -> tuple[float, float]:
        return self.live.evaluate_initial()

    def execute(
        self,
        round_index: int,
        selected: NDArray[np.int64],
        profile: SiteProfile,
        split_half: bool,
    ) -> RoundOutcome | None:
        outcome = self.live.execute(round_index, selected, profile, split_half)
        kept = None if outcome is None else replace(outcome, params=None)
        self._new.append(JournalEntry(round_index, tuple(int(s) for s in selected), kept))
        return outcome
