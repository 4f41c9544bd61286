"""Framework overhead per round: the real services vs the in-process emulator, same rounds.

Both train the same sites with the same code for the same number of rounds (select-all, so the
selection is identical); the emulator does it in one process with one batched training call, the
services broadcast the model over gRPC, train on W worker processes, stream the updates back,
fold them in order, evaluate and checkpoint. The difference per round is what the distributed
system costs (serialisation, streams, process hops, checkpoint), against the project's
"framework overhead <= 1 s/round" target.

    .venv/bin/python benchmarks/bench_round_overhead.py [--workers 4] [--sites 8,100] [--rounds 20]

``--sites`` takes a comma-separated list: one measurement per site count, so the overhead's growth
with the number of sites (per-site work in the round path) shows in one run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from powertrip.experiment import build_config  # noqa: E402
from powertrip.study.powertrip import run_study  # noqa: E402
from services.cli.launcher import ClusterPlan, LocalCluster  # noqa: E402


def total(url: str, name: str) -> float:
    """Sum of every sample called ``name`` (over all label sets) on a /metrics endpoint."""
    with urllib.request.urlopen(url, timeout=5) as r:
        families = text_string_to_metric_families(r.read().decode())
        return sum(s.value for f in families for s in f.samples if s.name == name)


def emulator_seconds_per_round(sites: int, rounds: int) -> float:
    cfg = build_config(
        "quick",
        num_sites=sites,
        policies=("select-all",),
        target_accuracy=0.99,
        max_rounds=rounds,
        static_sweep=(),
    )
    torch.set_num_threads(1)
    started = time.perf_counter()
    study = run_study(cfg)
    ((_, run),) = study.runs
    return (time.perf_counter() - started) / len(run.rounds)


def services_seconds_per_round(workers: int, sites: int, rounds: int) -> tuple[float, float]:
    """(wall seconds per round seen by the aggregator, mean training seconds per worker-round)."""
    with tempfile.TemporaryDirectory() as tmp:
        plan = ClusterPlan(
            workers=workers,
            sites=sites,
            policy="select-all",
            target=0.99,
            max_rounds=rounds,
            log_dir=Path(tmp) / "logs",
            checkpoint_dir=Path(tmp) / "checkpoints",
        )
        with LocalCluster(plan) as cluster:
            cluster.start()
            cluster.wait_done(timeout_s=1800)
            agg = cluster.aggregator.metrics_url
            wall = total(agg, "powertrip_round_wall_duration_seconds_sum")
            count = total(agg, "powertrip_round_wall_duration_seconds_count")
            workers_ = [s.metrics_url for s in cluster.services if s.name.startswith("worker")]
            # every site of a worker reports the worker's batched training time
            train = sum(total(u, "powertrip_worker_train_duration_seconds_sum") for u in workers_)
            n = sum(total(u, "powertrip_worker_train_duration_seconds_count") for u in workers_)
    return wall / count, train / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--sites", default="8", help="site counts, comma-separated (8,100)")
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    for sites in (int(n) for n in a.sites.split(",")):
        report(a.workers, sites, a.rounds)


def report(workers: int, sites: int, rounds: int) -> None:
    emu = emulator_seconds_per_round(sites, rounds)
    svc, train = services_seconds_per_round(workers, sites, rounds)
    print(f"{rounds} rounds of select-all over {sites} sites; services: {workers} workers")
    print(f"{'':34}{'s/round':>10}{'rounds/h':>10}")
    print(f"{'emulator (in-process, baseline)':34}{emu:10.3f}{3600 / emu:10.0f}")
    print(f"{'services (gRPC, processes)':34}{svc:10.3f}{3600 / svc:10.0f}")
    print(
        f"services / emulator: {svc / emu:.2f}x; overhead {svc - emu:+.3f} s/round "
        f"(target <= 1 s: {'PASS' if svc - emu <= 1 else 'MISS'}); "
        f"mean worker training {train:.3f} s/round"
    )


if __name__ == "__main__":
    main()
