"""What a checkpoint's state gives a restarted PowerTrip run, checked field by field before use.

A checkpoint whose checksums verify can still carry a field of the wrong type (a buggy writer, or
someone with write access re-signing it): every field the run reads is type-checked here, inside
the loader's ``validate``, so such a checkpoint is rejected (``malformed``: TypeError;
``incompatible``: ValueError) with one line naming the field, and the previous good one loads,
instead of a replay crashing the aggregator at every restart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from powertrip.fedavg import NumpyParams
from powertrip.journal import JournalEntry
from powertrip.services.aggregator import checkpoint, journal_file
from powertrip.services.aggregator.journal_file import EMPTY, JournalFile


@dataclass(frozen=True)
class Resume:
    """What a checkpoint's state gives a restarted run: the rounds to replay (each with the
    sites that were down) and the initial evaluation."""

    journal: list[JournalEntry]
    initial: tuple[float, float] | None

    @property
    def down(self) -> dict[int, list[int]]:
        return {e.round: list(e.unavailable) for e in self.journal if e.unavailable}


def _number(state: dict, key: str) -> None:
    value = state.get(key, 0.0)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"state.{key} is a {type(value).__name__}, not a number")


def resume_state(ckpt: checkpoint.Checkpoint, num_sites: int | None = None) -> Resume:
    """The journal (one entry per round up to the checkpoint's) and the initial evaluation,
    every field type-checked: TypeError naming a field of the wrong type, ValueError one that
    does not fit (rounds, site indices), so a bad checkpoint is refused at load, not replayed."""
    state = ckpt.state
    for key in ("clock_s", "accuracy"):
        _number(state, key)
    if not isinstance(state.get("policy", ""), str):
        raise TypeError("state.policy is not a string")
    entries = state.get("journal", [])
    if not isinstance(entries, list):
        raise TypeError("state.journal is not a list")
    where = "journal" if ckpt.journal is None else journal_file.NAME
    journal = [JournalEntry.from_json(e, f"{where} entry {i}") for i, e in enumerate(entries, 1)]
    if [e.round for e in journal] != list(range(1, ckpt.round + 1)):
        raise ValueError(f"journal does not hold rounds 1..{ckpt.round}")
    old = state.get("unavailable", {})  # format 2: the masks beside the journal
    if not isinstance(old, dict) or not all(isinstance(v, list) for v in old.values()):
        raise TypeError("state.unavailable is not a mapping of rounds to site lists")
    for r, sites in old.items():
        if not r.isdigit() or not 1 <= int(r) <= ckpt.round:
            raise ValueError(f"state.unavailable names round {r!r}, not one of 1..{ckpt.round}")
        journal[int(r) - 1] = JournalEntry.from_json({**entries[int(r) - 1], "unavailable": sites})
    for e in journal:
        if num_sites is not None and not all(0 <= s < num_sites for s in e.selected):
            raise ValueError(f"journal round {e.round} selects a site not in 0..{num_sites - 1}")
        if num_sites is not None and not all(0 <= s < num_sites for s in e.unavailable):
            raise ValueError(f"journal round {e.round}: an unavailable site not in the run")
    initial = state.get("initial")
    if initial is None:
        return Resume(journal, None)
    if not isinstance(initial, list) or len(initial) != 2:
        raise TypeError("state.initial is not [accuracy, loss]")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in initial):
        raise TypeError("state.initial is not two numbers")
    return Resume(journal, (float(initial[0]), float(initial[1])))


def fits_run(
    template: NumpyParams, num_sites: int | None = None, momentum: bool = False
) -> Callable[[checkpoint.Checkpoint], None]:
    """A checkpoint's check: the model arrays of this run (names, shapes, dtypes), the outer
    momentum if and only if the run keeps one (``momentum``: an outer step with momentum; its
    arrays shaped as the model's), and a well-formed state (``resume_state``); TypeError or
    ValueError naming what does not fit."""

    def check(ckpt: checkpoint.Checkpoint) -> None:
        _same_arrays("model arrays", ckpt.params, template)
        if momentum and ckpt.round > 0 and ckpt.momentum is None:
            raise ValueError("no outer momentum: written by a run without the outer step")
        if not momentum and ckpt.momentum is not None:
            raise ValueError("an outer momentum, but this run takes no outer step with momentum")
        if ckpt.momentum is not None:
            _same_arrays("outer momentum arrays", ckpt.momentum, template)
        resume_state(ckpt, num_sites)

    return check


def _same_arrays(what: str, got: NumpyParams, template: NumpyParams) -> None:
    """ValueError unless ``got`` has ``template``'s names, shapes and dtypes."""
    if got.keys() != template.keys():
        raise ValueError(f"{what} {sorted(got)} are not this run's {sorted(template)}")
    for k, want in template.items():
        if (got[k].shape, got[k].dtype) != (want.shape, want.dtype):
            have = got[k]
            raise ValueError(
                f"array {k!r} is {have.dtype}{list(have.shape)}, not {want.dtype}{list(want.shape)}"
            )


def journal_writer(directory: Path, ckpt: checkpoint.Checkpoint | None) -> JournalFile:
    """The journal file's writer for a run resumed from ``ckpt`` (None: from round 0): it
    appends after the checkpoint's prefix, cutting off what lies past it (rounds of a newer,
    rejected checkpoint, or of a crash before the commit). A format 2 checkpoint's journal is
    staged whole, so the next checkpoint moves it into the file."""
    if ckpt is None or ckpt.journal is not None:
        return JournalFile(directory, EMPTY if ckpt is None else ckpt.journal)
    writer = JournalFile(directory, EMPTY)
    writer.extend(e.to_json() for e in resume_state(ckpt).journal)
    return writer
