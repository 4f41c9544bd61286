"""The aggregator tells the profiler about registered workers from a queue, not from the
registration handler: a notice never blocks a registration, and the latest address of a worker
is what the profiler gets."""

from __future__ import annotations

import threading
import time

from powertrip.services.aggregator.worker_tracker import WorkerTracker


class Recorder:
    """A ``send`` that records its calls and can hold them until released."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[str]]] = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, worker_id: str, address: str, sites: list[str]) -> None:
        self.calls.append((worker_id, address, sites))
        self.release.wait(5)


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
