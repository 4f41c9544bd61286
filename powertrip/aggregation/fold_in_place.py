"""One update folded into a round's FedAvg sums while it still arrives, and undone exactly if
it never completes.

Folding only once an update is complete and verified means keeping it somewhere until then (a
spool on disk for a large model) and reading it back: two extra passes over every byte, and the
round's last fold starts only when the last stream ends. An update whose turn it is (every site
before it in selection order is folded) can instead be folded piece by piece as it arrives,
provided a stream that dies half-way or fails its checksum still leaves the sums as they were.
Float addition is not undone by subtracting, so before a piece is added the sums it overwrites
are written to an undo log (an unlinked temporary file: page cache, not the process's memory);
``rollback`` writes them back, bit for bit, newest first. The update counts (weight, squared
norm, projection) only at ``commit``.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Sequence
from typing import BinaryIO

from numpy.typing import NDArray

from powertrip.aggregation.fedavg import StreamingFedAvg


class FoldCancelled(RuntimeError):
    """The fold was rolled back (its round closed) while its stream still sent pieces."""


class InPlaceFold:
    """Folds one update of ``weight`` into each of ``targets`` (the round's sums, and the split
    half's for a site in that half) piece by piece, undoably. Thread-safe: ``add`` runs in the
    update's stream thread, ``rollback`` may come from the thread that closes the round."""

    def __init__(
        self, targets: Sequence[StreamingFedAvg], weight: float, undo: BinaryIO | None = None
    ) -> None:
        self._targets = list(targets)
        self._weight = float(weight)
        self._sq = 0.0  # the update's squared norm, measured once (on the first target)
        self._proj = [0.0] * len(self._targets)
        # The undo log: ``undo``, a file the caller reuses fold after fold (one at a time:
        # rewriting pages already in the page cache costs half of fresh ones), else our own.
        self._own_undo = undo is None
        self._undo = tempfile.TemporaryFile() if undo is None else undo  # noqa: SIM115
        self._undo.seek(0)
        self._log: list[tuple[int, str, int, int]] = []  # (target, tensor, start, size)
        self._lock = threading.Lock()
        self._state = "open"
        self.folded = 0  # elements of the update folded so far

    def add(self, name: str, start: int, values: NDArray) -> None:
        """Fold a validated piece: the flat elements ``[start, start + values.size)`` of
        ``name``, in the accumulator's dtype or one it widens exactly (float32 for bfloat16)."""
        with self._lock:
            if self._state != "open":
                raise FoldCancelled(f"the fold was {self._state} before this piece arrived")
            for i, target in enumerate(self._targets):
                region = target.region(name, start, values.size)
                self._undo.write(memoryview(region.data).cast("B"))
                self._log.append((i, name, start, values.size))
                sq, proj = target.fold_piece(name, start, values, self._weight, norm=i == 0)
                self._sq += sq  # 0.0 from the other targets: norm=False
                self._proj[i] += proj
            self.folded += values.size

    def commit(self) -> None:
        """Count the update in every target (its pieces must cover the model exactly once: the
        stream that fed them was verified whole)."""
        with self._lock:
            if self._state != "open":
                raise FoldCancelled(f"the fold was {self._state} before its commit")
            self._state = "committed"
            self._release()
            for i, target in enumerate(self._targets):
                target.count_update(self._weight, self._sq, self._proj[i])

    def rollback(self) -> None:
        """Restore every region this fold touched; idempotent, a no-op after ``commit``."""
        with self._lock:
            if self._state != "open":
                return
            self._state = "rolled back"
            self._restore()

    def _restore(self) -> None:
        end = self._undo.tell()
        for i, name, start, size in reversed(self._log):
            region = self._targets[i].region(name, start, size)
            raw = memoryview(region.data).cast("B")
            end -= len(raw)
            self._undo.seek(end)
            if self._undo.readinto(raw) != len(raw):  # type: ignore[attr-defined]  # a TemporaryFile
                raise RuntimeError("the undo log is shorter than the folds it records")
        self._release()
        self._log.clear()

    def _release(self) -> None:
        if self._own_undo:
            self._undo.close()
