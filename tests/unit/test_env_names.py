"""The POWERTRIP_* names some service reads are derived from the declared settings; any other
is reported with the closest known name (services/env_names.py)."""

from __future__ import annotations

import logging

from powertrip.fetch import DATA_DIR_VARIABLE
from powertrip.learning.datasets.record import CACHE_DIR_VARIABLE
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.common.fault_points import VARIABLE as FAULT_INJECT
from powertrip.services.env_names import known_names, unknown_names, warn_unknown_names
from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.worker.config import WorkerConfig


def test_every_declared_setting_of_every_service_is_known_and_nothing_else():
    declared = {
        f"POWERTRIP_{field.upper()}"
        for cls in (AggregatorConfig, ProfilerConfig, WorkerConfig)
        for field in cls.model_fields
    }
    assert known_names() == declared | {CACHE_DIR_VARIABLE, DATA_DIR_VARIABLE, FAULT_INJECT}
    assert {"POWERTRIP_AGGREGATION", "POWERTRIP_SITES", "POWERTRIP_PROBE_INTERVAL_S"} <= declared
    assert "POWERTRIP_SITE_REGIONS" in declared  # an old name is still read


def test_a_typo_names_the_closest_setting():
    env = {
        "POWERTRIP_AGREGATION": "median",
        "POWERTRIP_LOCAL_OPTIMISER": "{}",
        "POWERTRIP_METRIC_PORT": "9000",
        "POWERTRIP_SHUTDOWN_GRACE": "5",
    }
    assert unknown_names(env) == {
        "POWERTRIP_AGREGATION": "POWERTRIP_AGGREGATION",
        "POWERTRIP_LOCAL_OPTIMISER": "POWERTRIP_LOCAL_OPTIMIZER",
        "POWERTRIP_METRIC_PORT": "POWERTRIP_METRICS_PORT",
        "POWERTRIP_SHUTDOWN_GRACE": "POWERTRIP_SHUTDOWN_GRACE_S",
    }


def test_nothing_close_is_no_guess_and_the_shared_prefix_is_no_likeness():
    assert unknown_names({"POWERTRIP_ZQXV": "1"}) == {"POWERTRIP_ZQXV": None}


def test_known_names_and_other_variables_are_left_alone():
    env = {
        "POWERTRIP_SITES": "0-3",  # a worker's, in an env file every service reads
        "POWERTRIP_PROFILER_ADDR": "p:1",
        "HOME": "/root",
        "OTHER_POWERTRIP_X": "1",
        CACHE_DIR_VARIABLE: "/tmp",
        FAULT_INJECT: "",
    }
    assert unknown_names(env) == {}


def test_the_warning_is_one_line_per_name(caplog):
    with caplog.at_level(logging.WARNING):
        warn_unknown_names("worker", {"POWERTRIP_AGREGATION": "median", "POWERTRIP_ZQXV": "1"})
    assert [r.getMessage() for r in caplog.records] == [
        "POWERTRIP_AGREGATION is not a setting of any PowerTrip service, so it is ignored: "
        "did you mean POWERTRIP_AGGREGATION?",
        "POWERTRIP_ZQXV is not a setting of any PowerTrip service, so it is ignored: "
        "powertrip-worker --help lists them",
    ]
