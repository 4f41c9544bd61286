"""The aggregator's update intake: one open round, who may submit, what arrived.

``RoundGate`` holds what every kind of round shares (admission, failures, the wait for the
last update, closing at the deadline); ``RoundCollector`` folds FedAvg sums on top of it (PowerTrip
mode), ``delta_inbox.DeltaInbox`` keeps each delta whole (curtailment mode's sub-rounds). A site
may send per-rank shards (``powertrip.services.aggregator.shards``), committed once all verified.

Updates are checked chunk by chunk as they stream in (``TensorStreamReceiver``) and folded in the
order the policy selected the sites, so the float32 sums, and hence the run, do not depend on
network timing and equal the emulator's bit for bit. The update whose turn it is folds straight
from its chunks (``direct_sink``, ``powertrip.aggregation.fold_in_place``: undone exactly if its
stream dies
or fails its checksum); one ahead of its turn waits in its spool (on disk when large). A stream
that dies mid-way or carries a bad value leaves the sums as they were. Memory stays one
accumulator (two with the split-half probe) plus a few chunks, whatever the number of uploads. A
order-statistic rule (``powertrip.aggregation.robust``, POWERTRIP_AGGREGATION trimmed-mean or
median) must
hold every accepted update instead: n models (1.5 n with the split-half probe), still folded in
selection order. The default ``robust`` rule judges an update by its whole norm, so it folds
each from its spool once verified (read twice: the norm, then the fold), never in-place.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO

from numpy.typing import NDArray

from powertrip.aggregation.fedavg import StreamingFedAvg
from powertrip.aggregation.fold_in_place import InPlaceFold
from powertrip.aggregation.fold_inputs import weight_problem
from powertrip.aggregation.robust import Aggregation
from powertrip.aggregation.robust_fedavg import AdaptiveBound
from powertrip.learning.params import NumpyParams
from powertrip.services.aggregator import metrics
from powertrip.services.aggregator.shards import ShardedUpdate, ShardIntake
from powertrip.services.common.errors import Duplicate, StaleRound
from powertrip.services.common.fault_points import fault_point
from powertrip.services.common.tensor_receiver import Sink, TensorStreamReceiver, VerifiedUpdate
from powertrip.sites.profiles import site_id


class CountedReceiver(TensorStreamReceiver):
    """A receiver counted in ``powertrip_update_streams_open`` from creation to its first close,
    so a stream a dead worker left behind shows as a leak instead of going unnoticed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counted = True
        metrics.UPDATE_STREAMS_OPEN.inc()

    def close(self) -> None:
        super().close()
        if self._counted:
            self._counted = False
            metrics.UPDATE_STREAMS_OPEN.dec()


class _Pieces:
    """A verified update's pieces, re-read from its spool on every iteration: a rule that reads
    an update twice (``robust``: its norm, then the fold) holds no copy of it."""

    def __init__(self, rx: VerifiedUpdate) -> None:
        self._rx = rx

    def __iter__(self) -> Iterator[tuple[str, int, NDArray]]:
        return iter(self._rx.pieces())


class RoundGate(ShardIntake):
    """Who may submit to one open round, which sites are still owed, and when it is over.

    ``allowance`` is the most weight each site may claim this round, from what the aggregator
    itself assigned it (its partition's samples, or its steps): a peer's count is a claim, not
    a fact, and one inflated weight would otherwise set the global model (reliability R26).
    """

    def __init__(
        self,
        round_index: int,
        selected: Sequence[int],
        allowance: Mapping[int, float] | None = None,
    ) -> None:
        self.round = round_index
        self.selected = [int(s) for s in selected]
        self.allowance = allowance
        self.failed: dict[int, str] = {}
        self.closed = False
        self._expected = set(self.selected)
        self._in_flight: set[int] = set()
        self._shards: dict[int, ShardedUpdate] = {}  # sites whose shards are arriving
        # Sites kept so far: ``done`` is O(1) per wake instead of a pass over every selected
        # site (quadratic in sites over a round); failures are counted by ``failed``.
        self._delivered_count = 0
        self._cv = threading.Condition()

    # -- what a subclass keeps (called with the lock held, except _prepare) ------------------
    def _delivered(self, site: int) -> bool:
        """O(1): the gate asks it on every admit, commit and fail."""
        raise NotImplementedError

    def _prepare(self, rx: VerifiedUpdate) -> Any:
        return rx  # outside the lock: a verified stream as ``_keep`` stores it

    def _keep(self, site: int, item: Any, weight: float) -> None:
        raise NotImplementedError

    def _discard(self, item: Any) -> None:  # a late arrival, refused: release what _prepare made
        pass

    def _changed(self) -> None:
        """A site delivered, failed or the round closed."""

    def direct_sink(self, site: int, weight: float) -> Sink | None:
        """Where ``site``'s checked values may go as they arrive, or None to spool them."""
        return None

    # -- the calls the servicer and the executor make ------------------------------------
    def admit(self, site: int, round_index: int) -> None:
        """Check an update header before its bytes are read."""
        with self._cv:
            self._check_open(site, round_index)
            # A rejected stream may be sent again whole while the round is open.
            self.failed.pop(site, None)
            self._in_flight.add(site)

    def weight_problem(self, site: int, weight: float) -> str | None:
        """Why ``site`` may not weight its update ``weight`` this round, or None: a count of at
        least 1 and at most what the round assigned the site (any finite, normal, bounded
        weight when no allowance is known)."""
        problem = weight_problem(weight)
        if problem is not None or self.allowance is None:
            return problem
        most = self.allowance.get(site)
        if most is None:
            return f"{site_id(site)} has no assignment in round {self.round}"
        if not 1 <= weight <= most:
            return (
                f"{site_id(site)} claims a weight of {weight:g}; round {self.round} assigned "
                f"it {most:g}, so at least 1 and at most {most:g} is accepted"
            )
        return None

    def commit(self, site: int, rx: VerifiedUpdate, weight: float) -> None:
        """Take a verified update (and ownership of ``rx``)."""
        item = self._prepare(rx)
        with self._cv:
            self._in_flight.discard(site)
            if self.closed:
                self._discard(item)
                raise StaleRound(f"round {self.round} closed before {site_id(site)} finished")
            if self._delivered(site):  # sent twice (it failed while its first stream ran)
                self._discard(item)
                raise Duplicate(f"{site_id(site)} already submitted round {self.round}")
            self._delivered_count += 1
            self.failed.pop(site, None)  # delivered after all: not failed
            self._keep(site, item, weight)
            self._changed()
            self._cv.notify_all()

    def fail(self, site: int, reason: str) -> None:
        with self._cv:
            self._in_flight.discard(site)
            if not self._delivered(site):
                self.failed.setdefault(site, reason)
            self._changed()
            self._cv.notify_all()

    @property
    def done(self) -> bool:
        return self._delivered_count + len(self.failed) >= len(self._expected)

    def wait(self, timeout_s: float) -> bool:
        """Until every selected site delivered or failed; False on timeout."""
        end = time.monotonic() + timeout_s
        with self._cv:
            while not self.done:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return True

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._drop_shards()
            for s in self.selected:
                if not self._delivered(s):
                    self.failed.setdefault(s, "deadline")
            self._changed()
            self._cv.notify_all()


class RoundCollector(RoundGate):
    """A round's aggregate (the run's rule, FedAvg by default), folded in selection order."""

    def __init__(
        self,
        round: int,  # noqa: A002 - the round's number, as everywhere else
        selected: Sequence[int],
        template: NumpyParams,
        split_half: bool = False,
        direction: NumpyParams | None = None,  # last global delta, for projections
        aggregation: Aggregation | None = None,  # the run's rule; the default (robust) if None
        allowance: Mapping[int, float] | None = None,  # most weight per site (RoundGate)
        bound: AdaptiveBound | None = None,  # the robust rule's, from the earlier rounds
    ) -> None:
        super().__init__(round, selected, allowance)
        rule = aggregation or Aggregation()
        self.agg = rule.make(template, direction=direction, bound=bound)
        self.half = rule.make(template, bound=bound) if split_half else None
        self.accepted: list[int] = []  # folded, in fold order
        self._folded: set[int] = set()  # the same sites, for O(1) membership
        self._half_sites = {s for j, s in enumerate(self.selected) if j % 2 == 0}
        self._ready: dict[int, tuple[VerifiedUpdate, float]] = {}
        self._direct: dict[int, InPlaceFold] = {}  # the site folding as its stream arrives
        self._undo: BinaryIO | None = None
        self._next = 0  # position in ``selected`` of the next update to fold
        # The accumulators' pages are faulted in while the sites train, not by the first fold
        # (which must wait for it: both write the same buffers).
        self._prefault = threading.Thread(
            target=self._prefault_buffers, name=f"round-{round}-prefault", daemon=True
        )
        self._prefault.start()

    def _prefault_buffers(self) -> None:
        self.agg.prefault()
        if self.half is not None:
            self.half.prefault()

    def _delivered(self, site: int) -> bool:
        return site in self._ready or site in self._folded

    def direct_sink(self, site: int, weight: float) -> Sink | None:
        """The fold itself, once every site before ``site`` in selection order is folded (its
        ``weight`` already checked): FedAvg's sums only, a robust rule keeps whole updates."""
        if type(self.agg) is not StreamingFedAvg:
            return None
        with self._cv:
            if not self._turn(site):
                return None
        self._prefault.join()
        targets = [self.agg]
        if isinstance(self.half, StreamingFedAvg) and site in self._half_sites:  # the same rule
            targets.append(self.half)
        # one undo log for the round's in-turn folds (one at a time), closed with the round
        self._undo = self._undo or tempfile.TemporaryFile()  # noqa: SIM115
        fold = InPlaceFold(targets, weight, self._undo)
        with self._cv:
            if not self._turn(site):  # closed meanwhile: nothing folded yet
                fold.rollback()
                return None
            self._direct[site] = fold
        return fold.add

    def _turn(self, site: int) -> bool:
        """Lock held: ``site`` is next to fold and has nothing folding or waiting."""
        return (
            not self.closed
            and self._next < len(self.selected)
            and self.selected[self._next] == site
            and site not in self._direct
            and not self._delivered(site)
        )

    def fail(self, site: int, reason: str) -> None:
        with self._cv:
            fold = self._direct.pop(site, None)
        if fold is not None:
            fold.rollback()  # before the failure is visible: nothing of it stays in the sums
        super().fail(site, reason)

    def close(self) -> None:
        with self._cv:
            self.closed = True  # no fold starts from here on (``_turn``)
            folds = list(self._direct.values())
            self._direct.clear()
        for fold in folds:  # each waits for a piece being folded; later pieces are refused
            fold.rollback()
        if self._undo is not None:
            self._undo.close()
        super().close()

    def _keep(self, site: int, item: VerifiedUpdate, weight: float) -> None:
        self._ready[site] = (item, weight)

    def _discard(self, item: VerifiedUpdate) -> None:
        item.close()

    def _changed(self) -> None:
        """Fold every update whose predecessors in selection order are folded (or, once the
        round is closed, failed: until then a rejected site may still resend)."""
        while self._next < len(self.selected):
            s = self.selected[self._next]
            if s in self._ready:
                rx, weight = self._ready.pop(s)
                self._prefault.join()
                try:
                    direct = self._direct.pop(s, None)
                    if direct is not None:  # folded as it arrived: only counted now
                        direct.commit()
                    else:
                        self.agg.add_pieces(_Pieces(rx), weight)
                        if self.half is not None and s in self._half_sites:
                            self.half.add_pieces(_Pieces(rx), weight)
                finally:
                    rx.close()
                self.accepted.append(s)
                self._folded.add(s)
                fault_point("aggregation", self.round)  # test hook: dies after 1st fold
            elif not (self.closed and s in self.failed):
                return
            self._next += 1
