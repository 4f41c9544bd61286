"""Root only: the services across network namespaces, each worker behind a tc-shaped link.

The profiler's measured bandwidth per site follows the shaped rate of the link its worker sits
behind, the run completes over those links, and everything the launcher made is gone after."""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.services.common.identity import PROFILER
from powertrip.v1 import aggregator_pb2, profiler_pb2, profiler_pb2_grpc


def _netns_works() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    name = f"ptprobe{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ok


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _netns_works(), reason="needs root with ip netns and tc"),
]

RATES_MBIT = {"worker-0": 10, "worker-1": 40}


@pytest.mark.reliability("R4")
def test_measured_links_follow_the_shaped_rates_and_the_run_completes(tmp_path):
    profile = tmp_path / "links.tsv"
    profile.write_text("".join(f"{w} {r}mbit 1ms\n" for w, r in RATES_MBIT.items()))
    plan = ClusterPlan(
        workers=2,
        sites=4,
        policy="select-all",
        clock="wall",
        target=0.99,
        max_rounds=3,
        log_dir=tmp_path / "logs",
        netns_profile=profile,
        # 8 MiB probes, and a re-measurement replaces the estimate instead of averaging
        extra_env={"POWERTRIP_PROBE_BYTES": str(8 << 20), "POWERTRIP_SMOOTHING": "1"},
    )
    with LocalCluster(plan) as cluster:
        cluster.start()
        status = cluster.wait_done(timeout_s=120)
        prefix = cluster.topology.prefix
        profiler = next(s for s in cluster.services if s.name == "profiler")
        # measure again now that no round competes for the links or the CPU
        with cluster.operator_channel(profiler.grpc_addr, PROFILER) as ch:  # mTLS, veths
            fresh = profiler_pb2_grpc.ProfilerServiceStub(ch).MeasureLinks(
                profiler_pb2.MeasureLinksRequest(), timeout=60
            )
        with urllib.request.urlopen(profiler.metrics_url, timeout=5) as r:
            families = list(text_string_to_metric_families(r.read().decode()))
    assert status.state == aggregator_pb2.RUN_STATE_DONE
    assert all(r.contributions == 4 for r in status.rounds)
    probed = {
        s.labels["site"]
        for f in families
        for s in f.samples
        if s.name == "powertrip_site_bandwidth_bytes_per_second" and s.value > 0
    }
    assert probed == {"site-000", "site-001", "site-002", "site-003"}
    measured = {p.site_id: p.bandwidth_bytes_per_second * 8 / 1e6 for p in fresh.sites}
    # worker-0 hosts sites 0-1, worker-1 sites 2-3; gRPC payload is ~96% of the wire rate
    for site, rate in [("site-000", 10), ("site-001", 10), ("site-002", 40), ("site-003", 40)]:
        assert measured[site] == pytest.approx(rate, rel=0.10), (site, measured)
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix not in namespaces
