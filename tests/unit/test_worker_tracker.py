"""The aggregator tells the profiler about registered workers from a queue, not from the
registration handler: a notice never blocks a registration, the latest address of a worker is
what the profiler gets, and no worker is sent twice at once."""

from __future__ import annotations

import threading
import time

import pytest

from services.aggregator.worker_tracker import WorkerTracker


class Recorder:
    """A ``send`` that records its calls and can hold them until released."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[str]]] = []
        self.release = threading.Event()
        self.release.set()
        self.active: set[str] = set()
        self.overlaps: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, worker_id: str, address: str, sites: list[str]) -> None:
        with self.lock:
            if worker_id in self.active:
                self.overlaps.append(worker_id)
            self.active.add(worker_id)
            self.calls.append((worker_id, address, sites))
        self.release.wait(5)
        with self.lock:
            self.active.discard(worker_id)


def wait_calls(rec: Recorder, n: int) -> None:
    end = time.monotonic() + 5
    while len(rec.calls) < n:
        assert time.monotonic() < end, rec.calls
        time.sleep(0.005)


def test_notices_go_out_in_arrival_order_and_a_worker_gets_its_latest_address():
    rec = Recorder()
    rec.release.clear()
    tracker = WorkerTracker(rec)
    tracker.track("w0", "10.0.0.1:1", ["site-000"])
    wait_calls(rec, 1)  # w0 is in flight, held
    tracker.track("w1", "10.0.0.2:1", ["site-001"])
    tracker.track("w2", "10.0.0.3:1", ["site-002"])
    tracker.track("w1", "10.0.0.9:1", ["site-001"])  # moved before its notice went out
    rec.release.set()
    assert tracker.wait_idle(5)
    assert rec.calls == [
        ("w0", "10.0.0.1:1", ["site-000"]),
        ("w2", "10.0.0.3:1", ["site-002"]),
        ("w1", "10.0.0.9:1", ["site-001"]),  # once, latest, behind the others
    ]


def test_track_returns_at_once_while_the_profiler_hangs():
    rec = Recorder()
    rec.release.clear()
    tracker = WorkerTracker(rec)
    start = time.monotonic()
    for i in range(200):
        tracker.track(f"w{i}", "127.0.0.1:1", [f"site-{i:03d}"])
    assert time.monotonic() - start < 0.5
    rec.release.set()
    assert tracker.wait_idle(5) and len(rec.calls) == 200


def test_a_worker_is_never_sent_by_two_threads_at_once():
    rec = Recorder()
    rec.release.clear()
    tracker = WorkerTracker(rec, threads=2)
    tracker.track("w0", "a:1", [])
    wait_calls(rec, 1)
    tracker.track("w0", "b:1", [])  # w0 is in flight: the second thread must take w1 instead
    tracker.track("w1", "c:1", [])
    wait_calls(rec, 2)
    assert rec.calls[1][0] == "w1"
    rec.release.set()
    assert tracker.wait_idle(5)
    assert rec.calls[2] == ("w0", "b:1", []) and not rec.overlaps


def test_a_failing_send_does_not_stop_the_tracker(caplog):
    sent = []

    def flaky(worker_id: str, address: str, sites: list[str]) -> None:
        if worker_id == "bad":
            raise RuntimeError("profiler exploded")
        sent.append(worker_id)

    tracker = WorkerTracker(flaky)
    tracker.track("bad", "a:1", [])
    tracker.track("good", "b:1", [])
    assert tracker.wait_idle(5)
    assert sent == ["good"] and "tracking worker bad failed" in caplog.text


def test_no_sender_threads_is_refused():
    with pytest.raises(ValueError, match="at least one"):
        WorkerTracker(lambda *_: None, threads=0)
