"""Global data progress over shards, so no sample is repeated or lost as sites come and go
(the curtailment paper's shard bookkeeping, arXiv 2602.22760).

The data is one stream of ``total_rows`` positions cut into contiguous shards. At each round
start the incomplete shards, most-progressed first, are dealt round-robin over the round's sites
(as the curtailment paper's ShardManager does); a site consumes its shards in that order, each
from its recorded row. Progress is committed per consumed batch, so whatever a departing site
trained on is recorded and the rest of its shards go back to the pool at the next deal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from powertrip import state_dict as sd


class ShardCursor:
    def __init__(self, total_rows: int, num_shards: int) -> None:
        if total_rows < 1:
            raise ValueError(f"need at least one row of data, got {total_rows}")
        if not 1 <= num_shards <= total_rows:
            raise ValueError(f"shards must be in [1, {total_rows}], got {num_shards}")
        bounds = np.linspace(0, total_rows, num_shards + 1).round().astype(np.int64)
        self.start = bounds[:-1]
        self.end = bounds[1:]
        self.progress = np.zeros(num_shards, dtype=np.int64)  # rows done per shard
        self.total_rows = total_rows

    @property
    def num_shards(self) -> int:
        return int(self.start.size)

    @property
    def rows_done(self) -> int:
        return int(self.progress.sum())

    @property
    def done(self) -> bool:
        return self.rows_done == self.total_rows

    def remaining(self, shards: Sequence[int] | None = None) -> int:
        idx = np.arange(self.num_shards) if shards is None else np.asarray(shards, dtype=np.int64)
        if idx.size == 0:
            return 0
        return int((self.end[idx] - self.start[idx] - self.progress[idx]).sum())

    def deal(self, sites: Sequence[str]) -> dict[str, list[int]]:
        """Incomplete shards, most-progressed first (ties: lower shard), round-robin."""
        if not sites:
            raise ValueError("cannot deal shards to no site")
        size = self.end - self.start
        open_ = np.flatnonzero(self.progress < size)
        order = open_[np.lexsort((open_, -self.progress[open_]))]
        return {s: [int(x) for x in order[i :: len(sites)]] for i, s in enumerate(sites)}

    def take(self, shards: Sequence[int], rows: int) -> NDArray[np.int64]:
        """Consume the next ``rows`` positions from ``shards`` in order and commit them."""
        if rows < 0:
            raise ValueError(f"cannot take {rows} rows")
        if rows > self.remaining(shards):
            raise ValueError(f"{rows} rows asked, only {self.remaining(shards)} left in shards")
        out: list[NDArray[np.int64]] = []
        need = rows
        for s in shards:
            if need == 0:
                break
            left = int(self.end[s] - self.start[s] - self.progress[s])
            n = min(left, need)
            if n > 0:
                first = int(self.start[s] + self.progress[s])
                out.append(np.arange(first, first + n, dtype=np.int64))
                self.progress[s] += n
                need -= n
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def give_back(self, rows: NDArray[np.int64]) -> None:
        """Return ``rows``, taken this round but never trained (their site's update did not
        arrive), to the pool: the next deal hands them out again. They must be the last rows
        taken from each of their shards (a round deals each shard to one site, so a site's
        untrained tail is); ValueError otherwise."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return
        shard = np.searchsorted(self.start, rows, side="right") - 1
        progress = self.progress.copy()
        for s in np.unique(shard):
            mine = np.sort(rows[shard == s])
            first = int(self.start[s] + progress[s]) - mine.size
            if mine[0] != first or not np.array_equal(mine, np.arange(first, first + mine.size)):
                raise ValueError(f"rows given back to shard {int(s)} are not its last taken")
            progress[s] -= mine.size
        self.progress = progress

    def state_dict(self) -> dict[str, Any]:
        """Each shard's progress (a copy): the cursor of a resumed run."""
        return {"total_rows": self.total_rows, "progress": self.progress.copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``'s value; TypeError or ValueError naming the field
        that does not fit this cursor (left unchanged)."""
        where = "cursor state"
        d = sd.fields(state, where, {"total_rows", "progress"})
        if sd.integer(d["total_rows"], f"{where}.total_rows") != self.total_rows:
            raise ValueError(f"{where}.total_rows is {d['total_rows']}, not {self.total_rows}")
        progress = sd.array(d["progress"], f"{where}.progress", np.int64)
        if progress.shape != self.progress.shape:
            raise ValueError(f"{where}.progress has {progress.size} shards, not {self.num_shards}")
        if (progress < 0).any() or (progress > self.end - self.start).any():
            raise ValueError(f"{where}.progress is outside its shards' sizes")
        self.progress = progress
