"""``run_study``'s log into an output folder (``StudyLog``): each run goes to the study's record
(``record.StudyRecord``, what a resume reads back) as it finishes, and its rows to rounds.csv
and, once the target is known, results.csv, so an interrupted study leaves what it finished.
``results.write_outputs`` then writes the tables whole, rows in the study's order."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from powertrip.rounds.loop import RoundRecord, RunResult
from powertrip.study.powertrip import RunSummary, StudyResult
from powertrip.study.record import RecordError, StudyRecord, append_rows, start_table
from powertrip.study.results import result_fields, result_row, round_fields, run_round_lines


def run_key(repeat: int, policy: str) -> str:
    """A run's key in the study's record."""
    return f"{policy}/repeat-{repeat}"


def run_json(run: RunResult, cache: tuple[int, int]) -> dict[str, Any]:
    """Everything a run's outputs are written from, as JSON values (floats exact)."""
    return {
        "policy": run.policy,
        "seed": int(run.seed),
        "target_accuracy": None if run.target_accuracy is None else float(run.target_accuracy),
        "initial_accuracy": float(run.initial_accuracy),
        "cache": [int(cache[0]), int(cache[1])],
        "rounds": [
            [
                int(r.round),
                float(r.time_s),
                float(r.duration_s),
                int(r.sites),
                float(r.accuracy),
                float(r.loss),
                [int(x) for x in r.selected],
                int(r.contributions),
                r.outcome,
            ]
            for r in run.rounds
        ],
    }


def run_from_json(entry: dict[str, Any]) -> tuple[RunResult, tuple[int, int]]:
    """``run_json``'s run and cache counts (RecordError naming the run when it does not fit)."""
    try:
        rounds = [
            RoundRecord(
                int(n),
                float(t),
                float(d),
                int(k),
                float(a),
                float(lo),
                tuple(map(int, sel)),
                int(c),
                str(o),
            )
            for n, t, d, k, a, lo, sel, c, o in entry["rounds"]
        ]
        target = entry["target_accuracy"]
        run = RunResult(
            str(entry["policy"]),
            int(entry["seed"]),
            None if target is None else float(target),
            rounds,
            float(entry["initial_accuracy"]),
        )
        hits, misses = (int(x) for x in entry["cache"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"the record of run {entry.get('run')!r} is damaged ({exc!r})") from None
    return run, (hits, misses)


class StudyLog:
    """``run_study``'s log into an output folder: each finished run goes to the record (for a
    resume) and its rows to rounds.csv and, once the target is known, results.csv, so an
    interrupted study leaves what it finished. ``write_outputs`` then writes the tables whole,
    in the study's order."""

    def __init__(self, record: StudyRecord, out_dir: Path) -> None:
        self.record = record
        self.out_dir = out_dir
        #: runs read back from the record instead of run again
        self.read_back = 0
        self._started = False

    def _start(self, result: StudyResult) -> None:
        """The tables start with the first run, so a study that fails before finishing one
        leaves the folder as it was."""
        if not self._started:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            start_table(self.out_dir / "results.csv", result_fields(result))
            start_table(self.out_dir / "rounds.csv", round_fields(result))
            self._started = True

    def recorded(self, repeat: int, policy: str) -> tuple[RunResult, tuple[int, int]] | None:
        entry = self.record.get(run_key(repeat, policy))
        if entry is None:
            return None
        self.read_back += 1
        return run_from_json(entry)

    def finished(
        self,
        result: StudyResult,
        repeat: int,
        run: RunResult,
        cache: tuple[int, int],
        computed: bool,
    ) -> None:
        self._start(result)
        if computed:
            self.record.add(run_key(repeat, run.policy), run_json(run, cache))
        lm = result.config.workload == "lm"
        append_rows(self.out_dir / "rounds.csv", run_round_lines(result, repeat, run, lm))

    def scored(self, result: StudyResult, summaries: Sequence[RunSummary]) -> None:
        rows = (result_row(result, s) for s in summaries)
        fields = result_fields(result)
        append_rows(self.out_dir / "results.csv", ([row[k] for k in fields] for row in rows))
