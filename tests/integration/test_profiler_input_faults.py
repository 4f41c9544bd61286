"""Reliability row R20: a bad power trace costs its own series, never the profiler.

A folder of real Google PDU exports with one file corrupted in each way a trace can go bad
(empty, truncated, NaN or negative utilisation, time going back, not a trace at all): the
profiler names the file, line and column in one log line, counts the file, and serves every
site from the good files, so selection still has a finite power for every site. Only when no
file is usable does it refuse to start, with that first error.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest

from powertrip.selection.base import RoundContext
from powertrip.selection.registry import build_policy
from powertrip.services.common.grpc_server import build_server
from powertrip.services.profiler import metrics
from powertrip.services.profiler.catalogue import SiteCatalogue
from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.profiler.servicer import LinkProber, ProfilerServicer
from powertrip.sites.profiles import SiteProfile
from powertrip.traces.io import TraceError
from powertrip.v1 import profiler_pb2, profiler_pb2_grpc
from tests.unit.test_power_traces import CORRUPTIONS, corrupt, google_dir

BAD_FILE = "cella_pdu6.csv"


def trace_folder(shared_data: Path, tmp_path: Path, how: str) -> Path:
    folder = tmp_path / "google-power"
    shutil.copytree(google_dir(shared_data), folder)
    lines = (folder / BAD_FILE).read_text().splitlines()
    (folder / BAD_FILE).write_text(corrupt(lines, how), newline="")
    return folder


def profiler_cfg(folder: Path, sites: int = 12) -> ProfilerConfig:
    return ProfilerConfig(
        num_sites=sites, power_model="google-trace", power_trace_path=folder, insecure=True
    )


def rejected() -> float:
    return metrics.TRACE_FILES_REJECTED._value.get()


@pytest.mark.reliability("R20")
@pytest.mark.parametrize(("how", "line", "column", "message"), CORRUPTIONS)
def test_a_corrupt_trace_file_is_named_skipped_and_the_rest_serve_every_site(
    shared_data, tmp_path, caplog, how, line, column, message
):
    folder = trace_folder(shared_data, tmp_path, how)
    before = rejected()

    with caplog.at_level(logging.ERROR, logger="powertrip.services.profiler.catalogue"):
        catalogue = SiteCatalogue(profiler_cfg(folder))

    assert rejected() == before + 1
    (record,) = [r for r in caplog.records if "power trace file skipped" in r.getMessage()]
    assert f"{folder / BAD_FILE}, line {line}" in record.getMessage()
    assert message in record.getMessage()
    assert "4 domains" in catalogue.power_label  # the five exports less the bad one
    for t_s in (0.0, 3_600.0, 86_400.0):
        power = catalogue.power.power_at(t_s)
        assert power.shape == (12,) and np.all(np.isfinite(power))
        assert np.all((power > 0) & (power <= 1))


@pytest.mark.reliability("R20")
def test_the_profiler_serves_and_a_policy_selects_despite_a_corrupt_file(shared_data, tmp_path):
    cfg = profiler_cfg(trace_folder(shared_data, tmp_path, "NaN"))
    servicer = ProfilerServicer(SiteCatalogue(cfg), LinkProber(cfg))
    server, port, _ = build_server(
        [lambda s: profiler_pb2_grpc.add_ProfilerServiceServicer_to_server(servicer, s)],
        "127.0.0.1:0",
        cfg,
    )
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = profiler_pb2_grpc.ProfilerServiceStub(channel).GetSiteProfiles(
                profiler_pb2.GetSiteProfilesRequest(time_seconds=7_200.0), timeout=10
            )
    finally:
        server.stop(grace=None)

    power = np.array([p.power_fraction for p in reply.sites])
    assert len(power) == 12 and all(math.isfinite(p) and 0 < p <= 1 for p in power)
    profile = SiteProfile(
        power=power, comm_s=np.full(12, 1.0), distance_mi=np.linspace(100, 1_200, 12)
    )
    ctx = RoundContext(1, 7_200.0, profile, 50.0, 1e9, np.random.default_rng(0))
    selected = build_policy("powertrip").select(ctx)
    assert 1 <= len(selected) <= 12


@pytest.mark.reliability("R20")
def test_with_no_usable_file_the_profiler_refuses_to_start_with_the_first_error(tmp_path):
    folder = tmp_path / "google-power"
    folder.mkdir()
    (folder / "a.csv").write_text("")
    (folder / "b.csv").write_text("when,watts\n1,2\n")

    with pytest.raises(TraceError, match=r"a\.csv, line 1: empty file"):
        SiteCatalogue(profiler_cfg(folder))
