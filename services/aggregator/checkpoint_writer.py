"""The aggregator's per-round checkpoint, written in the background: round r's checkpoint is
written while round r+1 broadcasts and trains, so no round waits for the checkpoint's fsyncs
(a few ms for a small model, seconds for one of GBs).

The invariant: **a checkpoint is durable before the next one starts.** One save at a time on a
thread of its own; ``submit`` first waits for the save in flight, so checkpoints commit in round
order and each journal append extends the prefix the previous manifest committed. ``wait``
(the run's end, or its stop) waits for the last one, so a run reported DONE has it on disk. A
save the disk refuses is reported exactly as ``checkpoint.save_or_report`` does (one warning,
one count of ``powertrip_checkpoint_write_failures_total``, the run goes on), only later; any
other exception (a bug) is raised in the run's thread at its next ``submit`` or ``wait``.

A save reads nothing the next round changes: the model is the round's own arrays
(``round_outcome`` builds each round's model in new buffers and never writes into an older
one: no copy needed), the outer momentum is replaced, never written into, by a step
(``NesterovOuter.state``), and the journal file is the writer's while a save is in flight: the
run stages the rounds' entries here (``stage``); they reach the file's writer at the next
``submit``, once no save is in flight.

A crash while round r's checkpoint is written may find round r+1 already trained by the
workers: the restart redoes round r, so a worker keeps its sites' optimizer states from two
rounds back (``powertrip.services.worker.sites_host``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from numpy.typing import NDArray

from powertrip.services.aggregator import checkpoint, metrics
from powertrip.services.aggregator.journal_file import JournalFile


class CheckpointWriter:
    """Writes the run's checkpoints one at a time, each on a thread of its own."""

    def __init__(self, journal: JournalFile) -> None:
        self.journal = journal  # touched by the saving thread only while a save is in flight
        self._staged: list[Mapping[str, Any]] = []
        self._in_flight: Future[bool] | None = None

    @property
    def directory(self) -> Path:
        return self.journal.directory

    def stage(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """Journal entries of rounds run since the last ``submit``; the next checkpoint
        commits them (after a failed save, the one after it)."""
        self._staged.extend(entries)

    def submit(
        self,
        round_index: int,
        params: Mapping[str, NDArray],
        state: dict[str, Any],
        momentum: Mapping[str, NDArray] | None = None,
    ) -> None:
        """Start writing round ``round_index``'s checkpoint once the previous one is durable
        (or reported failed); returns as soon as the write has started."""
        self.wait()
        self.journal.extend(self._staged)
        self._staged = []
        done: Future[bool] = Future()

        def save() -> None:
            try:
                saved = checkpoint.save_or_report(
                    round_index,
                    lambda: checkpoint.save(
                        self.directory, round_index, params, state, self.journal, momentum
                    ),
                )
                if saved:  # a disk that refuses it: logged and counted, the run goes on
                    metrics.CHECKPOINT_ROUND.set(round_index)
                done.set_result(saved)
            except BaseException as exc:  # raised again in the run's thread
                done.set_exception(exc)

        self._in_flight = done
        # a daemon, as the run's thread is: a disk that hangs must not hold the exit past
        # its grace period (a checkpoint cut short leaves the previous one, as a crash does)
        threading.Thread(target=save, name=f"checkpoint-{round_index}", daemon=True).start()

    def wait(self) -> bool | None:
        """Block until the save in flight is over: True once durable, False when the disk
        refused it (already reported), None when none was in flight."""
        in_flight, self._in_flight = self._in_flight, None
        return None if in_flight is None else in_flight.result()
