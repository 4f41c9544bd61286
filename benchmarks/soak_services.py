"""Soak: a long run of the real services with faults injected every few rounds.

Every ``--every`` rounds one fault, in turn: a worker SIGKILLed and restarted, a worker frozen
(SIGSTOP) for a few seconds, the aggregator SIGKILLed and restarted from its checkpoint. Samples
the aggregator's open file descriptors, threads and RSS from /proc after each round, and checks
what a soak must show: every round accounted for (completed or failed, with a reason), a finite
model at the end, and no growth in FDs, threads or RSS beyond 10% between the first and the last
quarter of the run (each aggregator process measured on its own).

    .venv/bin/python benchmarks/soak_services.py [--rounds 200] [--every 20] [--workers 3]
"""

from __future__ import annotations

import argparse
import itertools
import math
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from powertrip.services.cli.launcher import ClusterPlan, LocalCluster  # noqa: E402


def proc_stats(pid: int) -> tuple[int, int, int]:
    """(open file descriptors, threads, RSS KiB) of a live process."""
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return fds, int(fields["Threads"]), int(fields["VmRSS"].split()[0])


def growth(samples: list[tuple[int, int, int]]) -> tuple[float, float, float]:
    """Ratio of the last quarter's mean to the first quarter's, per quantity."""
    q = max(1, len(samples) // 4)
    first, last = samples[:q], samples[-q:]
    return tuple(  # type: ignore[return-value]
        (sum(s[i] for s in last) / len(last)) / max(sum(s[i] for s in first) / len(first), 1e-9)
        for i in range(3)
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--every", type=int, default=20, help="rounds between faults")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--sites", type=int, default=6)
    a = ap.parse_args()
    faults = itertools.cycle(["kill-worker", "freeze-worker", "kill-aggregator"])
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        plan = ClusterPlan(
            workers=a.workers,
            sites=a.sites,
            policy="powertrip",
            target=0.999,  # unreachable: run the whole budget
            max_rounds=a.rounds,
            num_samples=2000,
            round_deadline_s=5,
            log_dir=Path(tmp) / "logs",
            checkpoint_dir=Path(tmp) / "checkpoints",
            extra_env={"POWERTRIP_MAX_FAILED_ROUNDS": str(a.rounds)},
        )
        with LocalCluster(plan) as cluster:
            cluster.start()
            per_process: list[list[tuple[int, int, int]]] = [[]]
            injected: list[tuple[int, str]] = []
            last_round, next_fault = 0, a.every
            while True:
                st = (
                    cluster.status(timeout_s=10)
                    if cluster.aggregator.process.poll() is None
                    else None
                )
                if st is None:
                    time.sleep(0.2)
                    continue
                if st.round > last_round:
                    last_round = st.round
                    per_process[-1].append(proc_stats(cluster.aggregator.process.pid))
                if st.state in (3, 4):  # DONE, FAILED
                    break
                if last_round >= next_fault:
                    next_fault += a.every
                    fault = next(faults)
                    injected.append((last_round, fault))
                    print(f"round {last_round}: {fault}", flush=True)
                    victim = f"worker-{len(injected) % a.workers}"
                    if fault == "kill-worker":
                        cluster.restart(victim)
                    elif fault == "freeze-worker":
                        proc = next(s for s in cluster.services if s.name == victim).process
                        proc.send_signal(signal.SIGSTOP)
                        time.sleep(3)
                        proc.send_signal(signal.SIGCONT)
                    else:
                        cluster.restart("aggregator")
                        per_process.append([])
                time.sleep(0.05)
            final = cluster.status(timeout_s=10)
    rounds = list(final.rounds)
    outcomes = {o: sum(r.outcome == o for r in rounds) for o in {r.outcome for r in rounds}}
    accounted = [r.round for r in rounds] == list(range(1, len(rounds) + 1))
    print(
        f"\n{len(rounds)} rounds in {time.monotonic() - started:.0f} s; outcomes {outcomes}; "
        f"faults {len(injected)}; every round accounted for: {accounted}"
    )
    print(f"final accuracy {final.accuracy:.4f} (finite: {math.isfinite(final.accuracy)})")
    ok = accounted and math.isfinite(final.accuracy) and final.state == 3
    print(f"{'aggregator process':<20}{'samples':>8}{'FDs x':>8}{'threads x':>10}{'RSS x':>8}")
    for i, samples in enumerate(per_process):
        if len(samples) < 8:
            continue  # too short to compare quarters
        fd, th, rss = growth(samples)
        fine = max(fd, th, rss) <= 1.10
        ok &= fine
        verdict = "PASS" if fine else "MISS"
        print(f"{i:<20}{len(samples):>8}{fd:>8.2f}{th:>10.2f}{rss:>8.2f}  {verdict}")
    print("PASS" if ok else "MISS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
