"""Which worker hosts which site; a run waits only for workers that are ready to train; a worker
is alive for one lease after its last heartbeat, and a dead one's sites are masked out."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
from prometheus_client import REGISTRY

from powertrip.services.aggregator.registry import LivenessLog, WorkerRegistry
from powertrip.services.common.errors import BadRequest, Duplicate, NotFound
from powertrip.sites.profiles import SiteProfile


def test_sites_count_once_their_worker_has_loaded_them():
    reg = WorkerRegistry(num_sites=4)
    reg.register("w0", "h:1", [0, 1], ready=False)  # fetching the run configuration
    assert reg.site_count == 0
    _, changed = reg.register("w0", "h:1", [0, 1], ready=True)
    assert changed and reg.site_count == 2


def test_a_heartbeat_changes_nothing_and_a_move_replaces_the_entry():
    reg = WorkerRegistry(num_sites=4)
    reg.register("w0", "h:1", [0, 1])
    assert reg.register("w0", "h:1", [1, 0]) == (reg.worker("w0"), False)
    worker, changed = reg.register("w0", "h:2", [2])
    assert changed and worker.address == "h:2"
    assert reg.owner(0) is None and reg.owner(2).worker_id == "w0"


def test_grouping_keeps_the_selection_order_per_worker():
    reg = WorkerRegistry(num_sites=6)
    reg.register("w0", "h:1", [0, 1, 2])
    reg.register("w1", "h:2", [3, 4])
    groups, orphans = reg.group([4, 0, 3, 2, 5])
    assert groups == {"w1": [4, 3], "w0": [0, 2]} and orphans == [5]


@pytest.mark.parametrize(
    ("worker", "sites", "error"),
    [("", [0], BadRequest), ("w", [], BadRequest), ("w", [9], NotFound)],
)
def test_bad_registrations_raise_the_mapped_error(worker, sites, error):
    with pytest.raises(error):
        WorkerRegistry(num_sites=4).register(worker, "h:1", sites)


def test_a_site_belongs_to_one_worker():
    reg = WorkerRegistry(num_sites=4)
    reg.register("w0", "h:1", [0])
    with pytest.raises(Duplicate, match="w0"):
        reg.register("w1", "h:2", [0])


# -- leases (docs/liveness.md) ------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.reliability("R1", "R2")
def test_a_worker_is_alive_for_one_lease_after_its_last_heartbeat(caplog):
    clock = FakeClock()
    reg = WorkerRegistry(num_sites=4, lease_s=5.0, clock=clock)
    reg.register("lease-a", "h:1", [0, 1])
    reg.register("lease-b", "h:2", [2, 3])
    clock.now += 5.0
    reg.register("lease-b", "h:2", [2, 3])  # a heartbeat renews the lease
    assert reg.sweep() == [] and reg.available().tolist() == [True] * 4
    before = metric("powertrip_worker_offline_total", worker="lease-a")
    clock.now += 0.01
    with caplog.at_level(logging.INFO, logger="powertrip.services.aggregator.registry"):
        assert reg.sweep() == ["lease-a"]
        assert reg.sweep() == []  # one transition, counted and logged once
    assert reg.available().tolist() == [False, False, True, True]
    assert reg.offline_sites() == [0, 1] and not reg.is_alive("lease-a")
    assert metric("powertrip_worker_offline_total", worker="lease-a") == before + 1
    assert metric("powertrip_workers_alive") == 1
    assert [r.message for r in caplog.records].count(
        "worker lease-a is offline: no heartbeat for 5.0 s"
    ) == 1


@pytest.mark.reliability("R2", "R18")
def test_an_offline_worker_is_back_with_its_next_heartbeat(caplog):
    clock = FakeClock()
    reg = WorkerRegistry(num_sites=2, lease_s=1.0, clock=clock)
    reg.register("back-a", "h:1", [0, 1])
    clock.now += 2
    reg.sweep()
    with caplog.at_level(logging.INFO, logger="powertrip.services.aggregator.registry"):
        _, changed = reg.register("back-a", "h:1", [0, 1])
    assert not changed  # a heartbeat, not a new registration
    assert reg.available().tolist() == [True, True]
    assert "worker back-a is back (heartbeat received)" in caplog.messages
    assert metric("powertrip_workers_alive") == 1


def test_a_worker_still_loading_its_sites_offers_none():
    reg = WorkerRegistry(num_sites=2, lease_s=10.0)
    reg.register("w0", "h:1", [0], ready=False)
    reg.register("w1", "h:2", [1])
    assert reg.available().tolist() == [False, True]


def test_without_a_lease_workers_never_expire():
    clock = FakeClock()
    reg = WorkerRegistry(num_sites=1, clock=clock)
    reg.register("w0", "h:1", [0])
    clock.now += 1e9
    assert reg.sweep() == [] and reg.available().all()


def profile(n: int) -> SiteProfile:
    return SiteProfile(np.linspace(0.2, 1.0, n), np.ones(n), np.zeros(n))


@pytest.mark.reliability("R1")
def test_the_round_mask_hides_dead_sites_and_is_absent_when_all_are_alive():
    clock = FakeClock()
    reg = WorkerRegistry(num_sites=4, lease_s=1.0, clock=clock)
    reg.register("w0", "h:1", [0, 1])
    reg.register("w1", "h:2", [2, 3])
    log = LivenessLog(reg, threading.Event(), wait_s=0.1)
    full = profile(4)
    assert log.mask(1, full, replaying=False) is full  # the emulator's profile, untouched
    clock.now += 0.9
    reg.register("w1", "h:2", [2, 3])
    clock.now += 0.2  # w0's lease ran out
    masked = log.mask(2, full, replaying=False)
    assert masked.available.tolist() == [False, False, True, True]
    assert log.to_state() == {"unavailable": {"2": [0, 1]}}


@pytest.mark.reliability("R1")
def test_a_restarted_run_replays_each_round_with_the_mask_it_had():
    reg = WorkerRegistry(num_sites=4, lease_s=1.0)
    reg.register("w0", "h:1", [0, 1, 2, 3])  # everyone alive now...
    down = LivenessLog.from_state({"unavailable": {"2": [0, 1]}})
    log = LivenessLog(reg, threading.Event(), wait_s=0.1, down=down)
    assert log.mask(1, profile(4), replaying=True).available is None
    assert log.mask(2, profile(4), replaying=True).available.tolist() == [0, 0, 1, 1]


def test_with_no_site_alive_a_round_waits_at_most_its_wait_for_one():
    reg = WorkerRegistry(num_sites=1, lease_s=1.0)
    log = LivenessLog(reg, threading.Event(), wait_s=0.3)
    started = time.monotonic()
    log.wait_for_a_site()
    assert 0.3 <= time.monotonic() - started < 1.0
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    LivenessLog(reg, stop, wait_s=30).wait_for_a_site()  # a stopping run does not wait
    assert time.monotonic() - started < 0.5


@pytest.mark.reliability("R1")
def test_a_worker_refusing_connections_is_offline_at_once_until_its_next_heartbeat():
    reg = WorkerRegistry(num_sites=2, lease_s=60.0)
    reg.register("gone-a", "h:1", [0])
    reg.register("gone-b", "h:2", [1])
    reg.unreachable("gone-a")  # StartRound answered UNAVAILABLE
    assert reg.available().tolist() == [False, True]
    reg.register("gone-a", "h:1", [0])
    assert reg.available().tolist() == [True, True]
