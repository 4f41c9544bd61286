"""Which worker hosts which site; a run waits only for workers that are ready to train."""

from __future__ import annotations

import pytest

from services.aggregator.registry import WorkerRegistry
from services.common.errors import BadRequest, Duplicate, NotFound


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
