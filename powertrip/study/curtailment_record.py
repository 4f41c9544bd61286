"""A curtailment study's finished run as a line of its record (``record.StudyRecord``): the run's
own ``state_dict`` plus what that leaves out and the outputs read (each round's data rows, as
runs of consecutive positions, the sites' power logs and the run's end), floats exact, so a
resumed study reports a run it reads back exactly as the process that ran it would have."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from powertrip.curtailment.emissions import SitePowerLog
from powertrip.curtailment.run_model import ElasticRun, ElasticSite
from powertrip.study.record import RecordError


def elastic_run_json(run: ElasticRun) -> dict[str, Any]:
    return {
        "state": run.state_dict(),
        "rows": [[_segments(w.rows) for w in r.work] for r in run.rounds],
        "power_logs": [
            [log.site, log.region, log.train_kw, log.idle_kw, log.on, log.training]
            for log in run.power_logs
        ],
        "end_s": run.end_s,
    }


def elastic_run_from_json(
    entry: dict[str, Any], name: str, sites: tuple[ElasticSite, ...], total_rows: int
) -> ElasticRun:
    """``elastic_run_json``'s run of ``sites`` (RecordError naming the run when the entry does
    not fit them)."""
    run = ElasticRun(name, sites, total_rows)
    try:
        run.load_state_dict(entry["state"])
        rows = entry["rows"]
        if len(rows) != len(run.rounds):
            raise ValueError(f"{len(rows)} rounds of rows for {len(run.rounds)} rounds")
        run.rounds = [
            replace(
                r,
                work=tuple(
                    replace(w, rows=_positions(x)) for w, x in zip(r.work, parts, strict=True)
                ),
            )
            for r, parts in zip(run.rounds, rows, strict=True)
        ]
        run.power_logs = [
            SitePowerLog(
                str(site),
                str(region),
                float(train),
                float(idle),
                [(float(a), float(b)) for a, b in on],
                [(float(a), float(b)) for a, b in training],
            )
            for site, region, train, idle, on, training in entry["power_logs"]
        ]
        run.end_s = float(entry["end_s"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"the record of run {name!r} is damaged ({exc})") from None
    return run


def _segments(rows: NDArray[np.int64]) -> list[list[int]]:
    """[start, count] of each run of consecutive positions, in order."""
    out: list[list[int]] = []
    for x in rows.tolist():
        if out and out[-1][0] + out[-1][1] == x:
            out[-1][1] += 1
        else:
            out.append([x, 1])
    return out


def _positions(segments: list[list[int]]) -> NDArray[np.int64]:
    parts = [np.arange(int(a), int(a) + int(n), dtype=np.int64) for a, n in segments]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
