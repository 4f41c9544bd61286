"""A finished run's newest checkpoint corrupted: the restarted aggregator logs the rejection and
resumes from the round before; every checkpoint corrupted: it refuses to start (exit code 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from powertrip.services.cli.launcher import ClusterPlan, LocalCluster
from powertrip.v1 import aggregator_pb2

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def small_plan(out, logs: str) -> ClusterPlan:
    return ClusterPlan(
        workers=1,
        sites=2,
        policy="select-all",
        preset="quick",
        max_rounds=3,
        seed=0,
        log_dir=out / logs,
        checkpoint_dir=out / "checkpoints",
    )


def flip_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.reliability("R7")
def test_a_corrupted_newest_checkpoint_resumes_from_the_round_before(tmp_path):
    with LocalCluster(small_plan(tmp_path, "first")) as cluster:
        cluster.start()
        first = cluster.wait_done(timeout_s=50)
    assert first.state == aggregator_pb2.RUN_STATE_DONE and first.round == 3
    flip_byte(tmp_path / "checkpoints" / "round-000003.npz")

    with LocalCluster(small_plan(tmp_path, "second")) as cluster:
        cluster.start()
        second = cluster.wait_done(timeout_s=50)
    assert second.state == aggregator_pb2.RUN_STATE_DONE and second.round == 3
    log = (tmp_path / "second" / "aggregator.log").read_text()
    rejections = [line for line in log.splitlines() if "checkpoint rejected" in line]
    assert len(rejections) == 1
    assert "round-000003.npz" in rejections[0] and "model-checksum" in rejections[0]
    assert "resuming after round 2" in log
    assert (tmp_path / "checkpoints" / "round-000003.npz.rejected").exists()
    # round 3 trained again and checkpointed anew: the same selections as the first run
    assert [list(r.selected_site_ids) for r in second.rounds] == [
        list(r.selected_site_ids) for r in first.rounds
    ]


@pytest.mark.reliability("R7")
def test_every_checkpoint_corrupted_refuses_to_start(tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    (ckpts / "round-000001.json").write_text("[]")
    env = {k: v for k, v in os.environ.items() if not k.startswith("POWERTRIP_")}
    env |= {
        "POWERTRIP_PROFILER_ADDR": "127.0.0.1:1",  # never reached: it stops before
        "POWERTRIP_BIND_HOST": "127.0.0.1",
        "POWERTRIP_GRPC_PORT": "0",
        "POWERTRIP_METRICS_PORT": "0",
        "POWERTRIP_NUM_SITES": "2",
        "POWERTRIP_CHECKPOINT_DIR": str(ckpts),
        "POWERTRIP_INSECURE": "1",
    }
    cmd = [sys.executable, "-m", "powertrip.services.aggregator"]
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=50)
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert sum("checkpoint rejected" in line for line in lines) == 1
    assert "refusing to start" in lines[-1] and "POWERTRIP_START_FRESH=1" in lines[-1]
