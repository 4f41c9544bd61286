"""Framework overhead per round: the real services vs the in-process emulator, same rounds.

Both train the same sites with the same code for the same number of rounds (select-all, so the
selection is identical); the emulator does it in one process with one batched training call, the
services broadcast the model over gRPC, train on W worker processes, stream the updates back,
fold them in order, evaluate and checkpoint. The difference per round is what the distributed
system costs (serialisation, streams, process hops, checkpoint), against the project's
"framework overhead <= 1 s/round" target.

Both sides are timed round to round, as a user waits for rounds: the emulator between two
rounds' ``on_round`` callbacks, the services between two rounds' lines in the aggregator's log
(``round N: ...``, logged once the round is recorded and its checkpoint handed over; the next
round's line comes after that checkpoint is durable, so each interval holds what the
checkpoint costs the round loop). Start-up, data generation and the initial evaluation are
outside every interval. ``benchmarks/suite/overhead.py`` (the ``overhead`` section of
``benchmarks/run.py``) uses the same functions.

    .venv/bin/python benchmarks/bench_round_overhead.py [--workers 4] [--sites 8,100] [--rounds 20]

``--sites`` takes a comma-separated list: one measurement per site count, so the overhead's growth
with the number of sites (per-site work in the round path) shows in one run.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from powertrip.config.experiment import ExperimentConfig, build_config  # noqa: E402
from powertrip.services.cli.launcher import ClusterPlan, LocalCluster  # noqa: E402
from powertrip.study.powertrip import run_study  # noqa: E402


def total(url: str, name: str) -> float:
    """Sum of every sample called ``name`` (over all label sets) on a /metrics endpoint."""
    with urllib.request.urlopen(url, timeout=5) as r:
        families = text_string_to_metric_families(r.read().decode())
        return sum(s.value for f in families for s in f.samples if s.name == name)


#: the aggregator's line for a finished round (``powertrip.services.aggregator.run``), and its
#: time stamp
ROUND_LINE = re.compile(
    r"^ts=(\S+ \S+) level=INFO service=aggregator logger=powertrip\.services\.aggregator\.run "
    r"msg=round (\d+): "
)


def study_config(sites: int, rounds: int) -> ExperimentConfig:
    """The ``quick`` preset, select-all over ``sites`` sites, ``rounds`` rounds: what both
    sides run (the services get the same preset, policy, target and rounds from ``ClusterPlan``)."""
    return build_config(
        "quick",
        num_sites=sites,
        policies=("select-all",),
        target_accuracy=0.99,
        max_rounds=rounds,
        static_sweep=(),
    )


def intervals(stamps: list[float]) -> list[float]:
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def emulator_round_times(sites: int, rounds: int) -> list[float]:
    """Wall seconds between consecutive rounds' ``on_round`` callbacks (one torch thread; the
    caller's thread count is restored)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    stamps: list[float] = []
    try:
        cfg = study_config(sites, rounds)
        run_study(cfg, on_round=lambda *_: stamps.append(time.perf_counter()))
    finally:
        torch.set_num_threads(threads)
    return intervals(stamps)


@dataclass
class ServicesRounds:
    round_s: list[float]  # wall seconds between consecutive rounds' lines in the aggregator log
    train_s: float  # mean training seconds per worker-round (the workers' own metric)


def round_stamps(log: Path) -> list[float]:
    """Epoch seconds of each finished round's line in an aggregator log, in round order."""
    stamps: dict[int, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = ROUND_LINE.match(line)
        if m:
            ts = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f")
            stamps[int(m[2])] = ts.timestamp()
    return [stamps[r] for r in sorted(stamps)]


def services_round_times(workers: int, sites: int, rounds: int) -> ServicesRounds:
    """The same rounds over a ``LocalCluster`` (a checkpoint every round), timed round to round
    from the aggregator's log."""
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
            workers_ = [s.metrics_url for s in cluster.services if s.name.startswith("worker")]
            # every site of a worker reports the worker's batched training time
            train = sum(total(u, "powertrip_worker_train_duration_seconds_sum") for u in workers_)
            n = sum(total(u, "powertrip_worker_train_duration_seconds_count") for u in workers_)
            log = cluster.aggregator.log_path
            assert log is not None
            stamps = round_stamps(log)
    return ServicesRounds(intervals(stamps), train / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--sites", default="8", help="site counts, comma-separated (8,100)")
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    for sites in (int(n) for n in a.sites.split(",")):
        report(a.workers, sites, a.rounds)


def report(workers: int, sites: int, rounds: int) -> None:
    emu = statistics.median(emulator_round_times(sites, rounds))
    services = services_round_times(workers, sites, rounds)
    svc = statistics.median(services.round_s)
    print(f"{rounds} rounds of select-all over {sites} sites; services: {workers} workers")
    print(f"{'median, round to round':34}{'s/round':>10}{'rounds/h':>10}")
    print(f"{'emulator (in-process, baseline)':34}{emu:10.3f}{3600 / emu:10.0f}")
    print(f"{'services (gRPC, processes)':34}{svc:10.3f}{3600 / svc:10.0f}")
    print(
        f"services / emulator: {svc / emu:.2f}x; overhead {svc - emu:+.3f} s/round "
        f"(target <= 1 s: {'PASS' if svc - emu <= 1 else 'MISS'}); "
        f"mean worker training {services.train_s:.3f} s/round"
    )


if __name__ == "__main__":
    main()
