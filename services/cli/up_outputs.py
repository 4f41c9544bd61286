"""What ``powertrip up`` writes beside its logs: every round as CSV, and a Prometheus config
that scrapes the cluster it started."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from powertrip.services.cli.service_process import Service
from powertrip.v1 import aggregator_pb2


def write_rounds_csv(path: Path, policy: str, rounds: list[aggregator_pb2.RoundSummary]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "policy",
                "round",
                "time_seconds",
                "duration_seconds",
                "sites",
                "contributions",
                "accuracy",
                "loss",
                "outcome",
                "selected",
            ]
        )
        for r in rounds:
            w.writerow(
                [
                    policy,
                    r.round,
                    f"{r.clock_seconds:.3f}",
                    f"{r.duration_seconds:.3f}",
                    len(r.selected_site_ids),
                    r.contributions,
                    f"{r.accuracy:.4f}",
                    f"{r.loss:.4f}",
                    r.outcome,
                    " ".join(r.selected_site_ids),
                ]
            )


def write_scrape_config(path: Path, services: Iterable[Service]) -> Path:
    """A Prometheus config that scrapes every service of this cluster (job per service kind,
    the run clock's fast pace in mind: 1 s interval)."""
    jobs: dict[str, list[str]] = {}
    for s in services:
        jobs.setdefault(s.kind, []).append(s.metrics_url.split("//", 1)[1].split("/", 1)[0])
    lines = ["global:", "  scrape_interval: 1s", "scrape_configs:"]
    for kind, targets in jobs.items():
        lines += [
            f"  - job_name: {kind}",  # the k8s config's job names: what dashboards filter on
            "    static_configs:",
            "      - targets: [" + ", ".join(f"'{t}'" for t in targets) + "]",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path
