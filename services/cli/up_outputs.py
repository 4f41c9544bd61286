"""What ``powertrip up`` shows and writes beside its logs: the rounds as the aggregator reports
them (a bar, or rate-limited lines), every round as CSV, and a Prometheus config that scrapes
the cluster it started."""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Self

from rich.console import Console

from powertrip.services.cli.progress import EVERY_S, ProgressView, format_seconds
from powertrip.services.cli.service_process import Service
from powertrip.v1 import aggregator_pb2


class RoundsProgress:
    """``LocalCluster.wait_done``'s ``on_status``: the rounds the aggregator has reported, as
    one step of ``max_rounds`` (None: a curtailment run, which ends when its data is used up),
    on a terminal a bar with the ETA, elsewhere a line on the latest round at most every
    ``every_s`` seconds (the first at once) and one on the last. The status holds the latest
    rounds (by number: its history is bounded), so a round is shown once however often it is
    polled."""

    def __init__(
        self,
        console: Console,
        max_rounds: int | None,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.view = ProgressView(console, every_s, clock)
        self.max_rounds = max_rounds
        self.step = self.view.step("waiting for the first round", max_rounds)
        self.last: aggregator_pb2.RoundSummary | None = None

    def __enter__(self) -> Self:
        self.view.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.view.__exit__(None, None, None)

    def __call__(self, st: aggregator_pb2.GetStatusResponse) -> None:
        newer = [r for r in st.rounds if self.last is None or r.round > self.last.round]
        if newer:
            self.last = newer[-1]
            self._show(self.last, ended=False)
        ended = st.state in (aggregator_pb2.RUN_STATE_DONE, aggregator_pb2.RUN_STATE_FAILED)
        if ended and self.last is not None:
            self._show(self.last, ended=True)

    def _show(self, r: aggregator_pb2.RoundSummary, ended: bool) -> None:
        of = "" if self.max_rounds is None else f"/{self.max_rounds}"
        detail = (
            f"round {r.round}{of}, {len(r.selected_site_ids)} sites, {r.contributions} updates, "
            f"accuracy {r.accuracy:.4f}, clock {format_seconds(r.clock_seconds)}"
        )
        if r.outcome != "completed":
            detail += f", {r.outcome}"
        total = None if self.max_rounds is None else max(self.max_rounds, r.round)
        first = self.step.description != "training"
        self.step.update(
            r.round, total, description="training", detail=detail, last=ended, always=first
        )


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
