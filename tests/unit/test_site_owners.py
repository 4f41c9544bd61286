"""The site owners map (R28): its two forms, refused at start when wrong (naming the entry), the
one-line refusal a claim gets, the file re-read on change, the registry moving a site to the
worker the map gives it, and ``powertrip up`` binding its own split."""

from __future__ import annotations

import logging
import os

import pytest

from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.registry import WorkerRegistry
from powertrip.services.aggregator.site_owners import SiteOwners, parse_owners, read_owners
from powertrip.services.cli.launcher import ClusterPlan
from powertrip.services.common.config import ConfigError, load_config
from powertrip.services.common.errors import Duplicate

pytestmark = pytest.mark.reliability("R28")
BASE = {"POWERTRIP_PROFILER_ADDR": "x:1", "POWERTRIP_INSECURE": "1", "POWERTRIP_NUM_SITES": "8"}


def test_entries_use_the_site_list_syntax_of_powertrip_sites():
    owners = parse_owners("w0=0-3; w1=site-004,site-006 ;w2=5,7", num_sites=8)
    assert owners == {"w0": {0, 1, 2, 3}, "w1": {4, 6}, "w2": {5, 7}}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("w0=0-3;w1=3-5", "entry 'w1=3-5': site-003 already assigned to 'w0'"),
        ("w0=0-3;w1=4-11", "entry 'w1=4-11': site-008..site-011 not in this run (8 sites"),
        ("w0=0-3;w 1=4", "entry 'w 1=4': bad worker id 'w 1'"),
        ("w0=0-3;w1=4-x", "entry 'w1=4-x': bad site id 'x'"),
        ("w0=0-3;w1=7-4", "entry 'w1=7-4': bad site range '7-4'"),
        ("w0=0-3;w1:4", "entry 'w1:4': expected WORKER_ID=SITES"),
        ("w0=0;w0=1", "entry 'w0=1': worker 'w0' already has an entry"),
        ("operator=0", "entry 'operator=0': the operator identity cannot host sites"),
    ],
)
def test_a_bad_map_is_a_configuration_error_naming_the_entry(value, message):
    with pytest.raises(ConfigError) as exc:
        load_config(AggregatorConfig, {**BASE, "POWERTRIP_SITE_OWNERS": value})
    assert str(exc.value).startswith(f"POWERTRIP_SITE_OWNERS {message}")


def test_a_bad_owners_file_is_a_configuration_error_naming_the_line(tmp_path):
    path = tmp_path / "owners.txt"
    path.write_text("# worker: sites\nw0: 0-3\nw1: 2-5\n")
    env = {**BASE, "POWERTRIP_SITE_OWNERS_FILE": str(path)}
    with pytest.raises(ConfigError, match=r"owners.txt' line 3: site-002..site-003 already"):
        load_config(AggregatorConfig, env)
    with pytest.raises(ConfigError, match="not both"):
        load_config(AggregatorConfig, {**env, "POWERTRIP_SITE_OWNERS": "w0=0"})


def test_unset_or_empty_means_first_come():
    for env in (BASE, {**BASE, "POWERTRIP_SITE_OWNERS": ""}):
        cfg = load_config(AggregatorConfig, env)
        assert not SiteOwners(cfg.site_owners, cfg.site_owners_file).active
    assert SiteOwners().refusal("anyone", [0, 1]) is None and SiteOwners().verdict("x") is None


def test_a_claim_outside_ones_own_sites_gets_one_line_naming_the_sites_and_their_owner():
    owners = SiteOwners("w0=0-3;w1=4-5", num_sites=8)
    assert owners.refusal("w0", [0, 3]) is None  # a subset of its own is fine
    assert owners.refusal("w1", [0, 1, 2, 4]) == (
        "worker 'w1' may not host site-000..site-002: assigned to 'w0'"
    )
    assert owners.refusal("w1", [5, 6, 7, 3]) == (
        "worker 'w1' may not host site-003: assigned to 'w0'; site-006..site-007: "
        "not assigned to any worker"
    )


def test_the_map_admits_only_the_workers_it_names():
    owners = SiteOwners("w0=0-3;w1=4-5")
    assert owners.verdict("w0") is None and owners.verdict("w9") == "not_allowed"


def edit(path, text: str, version: int) -> None:
    """Rewrite the file with a distinct mtime, even on a coarse clock."""
    path.write_text(text)
    os.utime(path, ns=(version, version))


def test_an_edited_owners_file_applies_at_once_and_a_bad_edit_keeps_the_last(tmp_path, caplog):
    path = tmp_path / "owners.txt"
    path.write_text("w0: 0-3  # the first four\nw1: 4-7\n")
    owners = SiteOwners(path=str(path), num_sites=8, check_every_s=0.0)
    edit(path, "w0: 0-2\nw1: 3-7\n", 1)
    assert owners.refusal("w1", [3]) is None and owners.refusal("w0", [3]) is not None
    edit(path, "w0: 0-2\n", 2)  # w1 removed: revoked, as from the allow-list file
    assert owners.verdict("w1") == "revoked"
    caplog.set_level(logging.ERROR)
    edit(path, "w0: 0-2\nw1 3-7\n", 3)  # a typo
    assert owners.owners() == {"w0": {0, 1, 2}}  # the last good map
    assert owners.owners() == {"w0": {0, 1, 2}}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "owners.txt' line 2" in errors[0]  # once, not per check


def test_an_unreadable_owners_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="site owners file .*gone.txt' unreadable"):
        read_owners(tmp_path / "gone.txt")


def test_the_registry_moves_a_site_to_the_worker_entitled_to_it():
    reg = WorkerRegistry(num_sites=4)
    reg.register("w0", "h:1", [0, 1])
    with pytest.raises(Duplicate):  # first-come: a live holder keeps it
        reg.register("w1", "h:2", [1])
    worker, changed = reg.register("w1", "h:2", [1, 2], entitled=True)
    assert changed and worker.sites == (1, 2)
    assert reg.worker("w0").sites == (0,) and reg.owner(1).worker_id == "w1"


def test_a_squatters_site_is_free_once_its_lease_runs_out():
    now = [100.0]
    reg = WorkerRegistry(num_sites=4, lease_s=5.0, clock=lambda: now[0])
    reg.register("squatter", "h:1", [0])
    with pytest.raises(Duplicate):
        reg.register("w0", "h:2", [0, 1])
    now[0] += 6.0  # the squatter stopped beating
    reg.register("w0", "h:2", [0, 1])
    assert reg.owner(0).worker_id == "w0"
    assert reg.offline_sites() == []  # the squatter, left with no site, is gone


def test_powertrip_up_binds_each_worker_to_its_share_of_the_sites():
    plan = ClusterPlan(workers=3, sites=12)
    assert plan.site_owners() == "worker-0=0-3;worker-1=4-7;worker-2=8-11"
    cfg = load_config(
        AggregatorConfig,
        {**BASE, "POWERTRIP_NUM_SITES": "12", "POWERTRIP_SITE_OWNERS": plan.site_owners()},
    )
    assert SiteOwners(cfg.site_owners, num_sites=12).refusal("worker-1", [3]) == (
        "worker 'worker-1' may not host site-003: assigned to 'worker-0'"
    )
