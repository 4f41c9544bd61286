"""What a service says about its settings when it starts, on real processes: a schedule longer
than the run or an absurd optimizer value is one line and exit 2 before READY (never a
traceback, never READY and then NaN rounds), and a POWERTRIP_* name no service reads is a
warning naming the closest setting (a typo must not silently leave the default on)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from powertrip.services.cli.service_process import READY, service_executable

TYPO = {"POWERTRIP_AGREGATION": "median"}
WARNING = (
    "POWERTRIP_AGREGATION is not a setting of any PowerTrip service, so it is ignored: "
    "did you mean POWERTRIP_AGGREGATION?"
)
#: 4 sites of 50 samples at batch 20: 3 local steps a round, 6 in the run's 2 rounds
SMALL_RUN = {
    "POWERTRIP_NUM_SITES": "4",
    "POWERTRIP_NUM_SAMPLES": "250",
    "POWERTRIP_MAX_ROUNDS": "2",
}


def run_service(kind: str, env: dict[str, str], timeout_s: float = 120) -> tuple[int, str, str]:
    """Run ``powertrip-<kind>`` until it exits: (exit code, stdout, stderr)."""
    keep = ("POWERTRIP_CACHE_DIR",)  # the test session's own (conftest)
    base = {k: v for k, v in os.environ.items() if not k.startswith("POWERTRIP_") or k in keep}
    base |= {
        "POWERTRIP_INSECURE": "1",
        "POWERTRIP_GRPC_PORT": "0",
        "POWERTRIP_METRICS_PORT": "0",
        "POWERTRIP_CHECKPOINT_DIR": "",
    }
    done = subprocess.run(
        [service_executable(kind)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return done.returncode, done.stdout, done.stderr


def errors(stderr: str) -> list[str]:
    """The lines of stderr that are not log records (the one-line refusal, a traceback)."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("ts=")]


@pytest.fixture(scope="module")
def too_long(tmp_path_factory):
    recipe = '{"name": "adamw", "schedule": "cosine", "total_steps": 100000}'
    env = {"POWERTRIP_PROFILER_ADDR": "127.0.0.1:1", "POWERTRIP_LOCAL_OPTIMIZER": recipe}
    env["POWERTRIP_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))  # before conftest's
    return recipe, run_service("aggregator", {**env, **SMALL_RUN, **TYPO})


def test_a_schedule_longer_than_the_run_is_one_line_naming_the_setting_and_the_runs_length(
    too_long,
):
    recipe, (code, stdout, stderr) = too_long
    assert code == 2, stderr
    assert not READY.search(stdout)
    assert errors(stderr) == [
        f"powertrip-aggregator: POWERTRIP_LOCAL_OPTIMIZER={recipe!r}: local_optimizer.total_steps "
        "(100000) is longer than the run: a site takes at most 6 local steps (2 rounds of 3)"
    ]


def test_an_absurd_optimizer_value_is_refused_before_ready_naming_its_field():
    # the other values and bounds: tests/unit/test_optimizer_bounds.py (the same parse)
    recipe, words = '{"name": "adamw", "lr": 1e30}', "lr: Input should be less than or equal to 10"
    env = {"POWERTRIP_PROFILER_ADDR": "127.0.0.1:1", "POWERTRIP_LOCAL_OPTIMIZER": recipe}
    code, stdout, stderr = run_service("aggregator", env)
    assert (code, READY.search(stdout)) == (2, None), stderr
    [line] = errors(stderr)
    assert line.startswith(f"powertrip-aggregator: POWERTRIP_LOCAL_OPTIMIZER={recipe!r}: ")
    assert words in line


def test_the_aggregator_warns_of_an_unknown_variable_naming_the_closest_setting(too_long):
    _, (_, _, stderr) = too_long
    assert WARNING in stderr


#: a worker that gets past its start (and so logs) and then gives up at once: nobody is there
LONELY_WORKER = {
    "POWERTRIP_AGGREGATOR_ADDR": "127.0.0.1:1",
    "POWERTRIP_SITES": "0-1",
    "POWERTRIP_REGISTER_TIMEOUT_S": "1",
    "POWERTRIP_DEVICE": "cpu",
}


def test_the_worker_and_the_profiler_warn_of_it_too():
    code, _, stderr = run_service("worker", {**LONELY_WORKER, **TYPO})
    assert code == 1 and WARNING in stderr
    env = {**os.environ, "POWERTRIP_GRPC_PORT": "0", "POWERTRIP_METRICS_PORT": "0", **TYPO}
    proc = subprocess.Popen(
        [service_executable("profiler")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert READY.search(proc.stdout.readline())  # a warning, not a refusal
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert WARNING in stderr


def test_other_services_settings_and_old_names_are_not_warned_of():
    env = {
        **LONELY_WORKER,
        "POWERTRIP_PROFILER_ADDR": "p:1",  # the aggregator's: one env file serves every service
        "POWERTRIP_PROBE_INTERVAL_S": "5",  # the profiler's
        "POWERTRIP_SITE_REGIONS": "A,B",  # an old name, still read where it applies
        "POWERTRIP_FAULT_INJECT": "",  # the crash tests' hook, read outside the settings
    }
    code, _, stderr = run_service("worker", env)
    assert code == 1 and "cannot join the run" in stderr  # it got past its start
    assert "is not a setting" not in stderr
