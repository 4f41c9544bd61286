"""Flow control sized to the link for update uploads (``UploadUpdate``).

One HTTP/2 stream moves at most one receive window per round trip, and gRPC's window is fixed
when the server starts (BDP probing grows it per connection without regard to memory). A window
small enough for many concurrent uploads on a LAN caps one upload on a long link: 4 MiB over
50 ms is ~80 MiB/s (benchmarks/bench_stream_window.py). So the transport window is set to the
most one upload may need (``POWERTRIP_STREAM_WINDOW_MIB``), and the aggregator meters each
upload with credits instead: chunk bytes the worker may send beyond what it was granted before.
Each upload's window is its site's bandwidth-delay product (the profiler's measured RTT x
bandwidth, twice, as TCP would want it) capped by the receive budget
(``POWERTRIP_RECEIVE_BUDGET_MIB``) divided among the uploads in flight, and credit is returned
as the aggregator consumes the stream, as TCP returns window. Credit outstanding over all uploads
stays within the budget (plus ``MIN_WINDOW`` per upload, so none stalls): an upload that starts
while others hold the budget gets more only as they consume, and a lone upload on a long link
gets the whole budget.

Credit binds cooperating workers. A peer that ignores it is still bounded by the transport
window per stream, and holds one stream per site it hosts (the round gate refuses duplicates).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from powertrip.services.common.tensor_stream import MiB
from powertrip.sites.profiles import site_index
from powertrip.v1 import aggregator_pb2

MIN_WINDOW = 1 * MiB  # two of the worker's 512 KiB chunks: a stream never stalls on one

#: the site's link as (RTT seconds, bytes per second) when measured, else None
LinkOf = Callable[[int], tuple[float, float] | None]


class ReceiveBudget:
    """The aggregator's memory for uploads in flight, and each upload's share of it."""

    def __init__(self, budget_bytes: int, max_window: int, link_of: LinkOf | None = None):
        self.budget = int(budget_bytes)
        self.max_window = max(int(max_window), MIN_WINDOW)
        self._link_of = link_of
        self._lock = threading.Lock()
        self.in_flight = 0
        self.outstanding = 0  # credit granted and not yet consumed, over every upload

    def open(self) -> None:
        with self._lock:
            self.in_flight += 1

    def close(self, outstanding: int = 0) -> None:
        """An upload ended with ``outstanding`` bytes of its credit unused."""
        with self._lock:
            self.in_flight -= 1
            self.outstanding -= outstanding

    def consumed(self, n: int) -> None:
        with self._lock:
            self.outstanding -= n

    def grant(self, site: int | None, own: int) -> int:
        """Credit to grant an upload that has ``own`` bytes outstanding: up to its window,
        within what the budget has left (an upload that started when others held the budget
        waits for them to consume, not the budget for it), and never below ``MIN_WINDOW`` of
        its own, so no upload stalls. 0 when nothing, or less than a quarter window, is due."""
        window = self.window(site)
        with self._lock:
            left = self.budget - self.outstanding
            room = min(window - own, max(left, MIN_WINDOW - own))
            if room <= 0 or (room < window // 4 and own >= MIN_WINDOW):
                return 0  # batched: a grant when a quarter window is due, or to the floor
            self.outstanding += room
            return room

    def window(self, site: int | None) -> int:
        """Bytes ``site``'s upload may have in flight now."""
        with self._lock:
            share = self.budget // max(1, self.in_flight)
        want = self.max_window
        link = self._link_of(site) if (self._link_of is not None and site is not None) else None
        if link is not None:
            rtt_s, bytes_per_s = link
            want = int(2 * rtt_s * bytes_per_s)
        return max(MIN_WINDOW, min(want, share, self.max_window))


def _site_of(first: Any) -> int | None:
    """The site an upload claims in its first message (sizing only: the body checks it)."""
    try:
        return site_index(first.update.site_id)
    except (AttributeError, ValueError):
        return None


class _Meter:
    """Hands the requests on and grants credit as the body consumes them: the first grant
    once it asks for the second message (the header passed its checks), then whenever the
    window has room for at least a quarter of itself again."""

    def __init__(self, budget: ReceiveBudget, replies: queue.SimpleQueue) -> None:
        self._budget = budget
        self._replies = replies
        self._granted = self._consumed = 0
        self._site: int | None = None
        self._open = False

    def requests(self, requests: Iterator[Any]) -> Iterator[Any]:
        for i, msg in enumerate(requests):
            if i == 0:
                self._site = _site_of(msg)
            yield msg  # returns once the body asks for the next message: this one is consumed
            if i == 0:
                self._budget.open()
                self._open = True
            elif msg.WhichOneof("part") == "chunk":
                n = min(len(msg.chunk.data), self._granted - self._consumed)  # beyond: ignored
                self._consumed += n
                self._budget.consumed(n)
            self._grant()

    def _grant(self) -> None:
        room = self._budget.grant(self._site, self._granted - self._consumed)
        if room > 0:
            self._granted += room
            self._replies.put(("credit", room))

    def close(self) -> None:
        if self._open:
            self._open = False
            self._budget.close(max(0, self._granted - self._consumed))


def credited(
    body: Callable[[Iterator[Any], Any], aggregator_pb2.SubmitUpdateResponse],
    requests: Iterator[Any],
    context: Any,
    budget: ReceiveBudget,
) -> Iterator[aggregator_pb2.UploadReply]:
    """``UploadUpdate``'s replies: ``body`` (SubmitUpdate's handling, unchanged) runs on its own
    thread over the metered requests while this generator sends its credits, then its result
    (or raises its exception, which the server's error mapping answers as for SubmitUpdate)."""
    replies: queue.SimpleQueue = queue.SimpleQueue()
    meter = _Meter(budget, replies)

    def run() -> None:
        try:
            replies.put(("result", body(meter.requests(requests), context)))
        except BaseException as exc:  # noqa: BLE001 - handed to the RPC's thread, re-raised
            replies.put(("error", exc))
        finally:
            meter.close()

    threading.Thread(target=run, name="upload-body", daemon=True).start()
    while True:
        kind, value = replies.get()
        if kind == "credit":
            yield aggregator_pb2.UploadReply(credit_bytes=value)
        elif kind == "result":
            yield aggregator_pb2.UploadReply(result=value)
            return
        else:
            raise value
