"""A site's update in per-rank shards: the round gate's sharded intake.

A site trained by N ranks (FSDP2) may send its update as N ``SubmitUpdate`` streams, shard i
holding rows ``shard_rows(dim0, N, i)`` of every tensor (``shard_specs``; the header's
``shard_index``/``shard_count``), raw or, under the run's codec, coded on their own (each
shard decoded once verified: ``coded_intake.receive_update``). Every number in those headers
is a claim: the count must be 1..``MAX_SHARDS`` and the same for every shard of the site this
round, the index below it and not seen before, the weight the same as the other shards', and
the shapes exactly what the aggregator computes from its own template; anything else is refused
naming site, round and shard.

How shards become a site's update, and why so: each verified shard waits in its own spool (in
memory up to 1 MiB, on disk beyond, as any verified update does until its turn to fold), and the
site is handed to the round's collector only once every shard verified, as one
``ShardedUpdate`` that replays the shards' pieces at their offsets in the whole tensors (a row
range of a C-order tensor is one flat range). The collector then folds it like a whole stream:
the same sums bit for bit, in selection order. A site whose shards do not all arrive before the
round closes never touches the sums, so there is never a partial model and nothing to subtract
back (float additions do not undo exactly). Memory: the aggregator's RSS does not grow with
shards (a few MiB of stream buffers each); the cost is disk, one update per site until it folds.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from powertrip.learning.shards import shard_rows
from powertrip.services.common.errors import Duplicate, StaleRound
from powertrip.services.common.tensor_receiver import VerifiedUpdate
from powertrip.services.common.tensor_stream import MiB, StreamError, TensorSpec
from powertrip.sites.profiles import site_id

__all__ = ["MAX_SHARDS", "ShardIntake", "ShardedUpdate"]

#: the most shards one site's update may come in (SiteEngineConfig's most ranks)
MAX_SHARDS = 64


def shard_label(site: int, round_index: int, index: int, count: int) -> str:
    return f"{site_id(site)} round {round_index} shard {index} of {count}"


class ShardedUpdate:
    """One site's shards in one round: the verified ones (each its receiver), those still
    streaming, and the count and weight every shard must repeat. Complete, it is the site's
    update: ``pieces``, ``arrays``, ``close`` and ``total_bytes`` as a receiver has them."""

    def __init__(
        self, site: int, round_index: int, count: int, weight: float, specs: Sequence[TensorSpec]
    ) -> None:
        self.site, self.round, self.count, self.weight = site, round_index, count, weight
        #: each verified shard: its receiver, or its payload decoded under the run's codec
        self.verified: dict[int, VerifiedUpdate] = {}
        self.in_flight: set[int] = set()
        self._specs = list(specs)  # the whole model's, as the aggregator holds it
        self._dim0 = {s.name: s.shape[0] if s.shape else 0 for s in self._specs}
        self._row = {s.name: math.prod(s.shape[1:]) for s in self._specs}

    def check(self, index: int, count: int, weight: float) -> None:
        """A further shard's header against the site's first: same count and weight, a new
        index (raises StreamError("shard") or Duplicate)."""
        if count != self.count:
            raise StreamError("shard", f"the site's other shards say {self.count} shards")
        if weight != self.weight:
            raise StreamError(
                "shard", f"weight {weight:g} differs from the site's other shards' {self.weight:g}"
            )
        if index in self.verified or index in self.in_flight:
            label = shard_label(self.site, self.round, index, count)
            raise Duplicate(f"{label} already arrived or is arriving")

    @property
    def complete(self) -> bool:
        return len(self.verified) == self.count

    @property
    def total_bytes(self) -> int:
        return sum(rx.total_bytes for rx in self.verified.values())

    def pieces(self, piece_bytes: int = 4 * MiB) -> Iterator[tuple[str, int, NDArray]]:
        """The shards' pieces in shard order, each at its flat offset in the whole tensor (same
        contract as ``TensorStreamReceiver.pieces``: a view valid until the next piece)."""
        for i in range(self.count):
            for name, start, values in self.verified[i].pieces(piece_bytes):
                lo = shard_rows(self._dim0[name], self.count, i)[0]  # 0-d: dim 0 of 0 rows
                yield name, lo * self._row[name] + start, values

    def arrays(self) -> dict[str, NDArray]:
        out = {s.name: np.empty(s.shape, dtype=np.dtype(s.dtype)) for s in self._specs}
        for name, start, values in self.pieces():
            flat = out[name].reshape(-1)
            flat[start : start + values.size] = values
        return out

    def close(self) -> None:
        for rx in self.verified.values():
            rx.close()
        self.verified.clear()


class ShardIntake:
    """The sharded path of ``RoundGate`` (a mixin: it shares the gate's lock and books). A site's
    shards are admitted and verified one by one; the last one to verify commits the whole site
    through the gate's ordinary ``commit``."""

    # the gate's, set by RoundGate.__init__
    round: int
    closed: bool
    failed: dict[int, str]
    _expected: set[int]
    _in_flight: set[int]
    _shards: dict[int, ShardedUpdate]
    _cv: threading.Condition
    if TYPE_CHECKING:

        def _delivered(self, site: int) -> bool: ...
        def _changed(self) -> None: ...
        def commit(self, site: int, rx: VerifiedUpdate, weight: float) -> None: ...

    def _check_open(self, site: int, round_index: int, sharded: bool = False) -> None:
        """Lock held: the round is open, the site selected and not already delivered or
        streaming (a whole update, or shards when ``sharded`` is False)."""
        if round_index != self.round or self.closed:
            state = "closed" if round_index == self.round else f"not open (open: {self.round})"
            raise StaleRound(f"round {round_index} is {state}")
        if site not in self._expected:
            raise StaleRound(f"{site_id(site)} was not selected in round {self.round}")
        if (
            self._delivered(site)
            or site in self._in_flight
            or (not sharded and site in self._shards)
        ):
            raise Duplicate(f"{site_id(site)} already submitted round {self.round}")

    def admit_shard(
        self,
        site: int,
        round_index: int,
        index: int,
        count: int,
        weight: float,
        specs: Sequence[TensorSpec],
    ) -> None:
        """Check a shard's header before its bytes are read; ``specs``: the whole model's."""
        with self._cv:
            self._check_open(site, round_index, sharded=True)
            if not 1 <= count <= MAX_SHARDS:
                raise StreamError("shard", f"1 to {MAX_SHARDS} shards are accepted")
            if index >= count:
                raise StreamError("shard", "the shard index is out of range")
            book = self._shards.get(site)
            if book is None:
                book = self._shards[site] = ShardedUpdate(site, round_index, count, weight, specs)
            else:
                book.check(index, count, weight)
            book.in_flight.add(index)
            self.failed.pop(site, None)  # a refused shard may be sent again while it is open

    def commit_shard(self, site: int, index: int, rx: VerifiedUpdate) -> None:
        """Take a verified shard (and ownership of ``rx``); the last one commits the site."""
        with self._cv:
            book = self._shards.get(site)
            if self.closed or book is None:
                rx.close()
                raise StaleRound(f"round {self.round} closed before {site_id(site)} finished")
            book.in_flight.discard(index)
            book.verified[index] = rx
            if not book.complete:
                return
            del self._shards[site]
            self._in_flight.add(site)  # until commit takes it: no whole update meanwhile
        self.commit(site, book, book.weight)

    def fail_shard(self, site: int, index: int | None, reason: str) -> None:
        """A shard refused (``index`` None: at its header, before it was admitted): the site
        fails unless its shards all arrive after all; the verified ones wait for that."""
        with self._cv:
            book = self._shards.get(site)
            if book is not None and index is not None:
                book.in_flight.discard(index)
                if not book.verified and not book.in_flight:  # its count and weight are free
                    del self._shards[site]
            if not self._delivered(site):
                self.failed.setdefault(site, reason)
            self._changed()
            self._cv.notify_all()

    def _drop_shards(self) -> None:
        """Lock held, at close: incomplete sites contribute nothing."""
        for book in self._shards.values():
            book.close()
        self._shards.clear()
