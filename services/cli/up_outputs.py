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

from powertrip.services.cli.progress import EVERY_S, ProgressView, Step, format_seconds
from powertrip.services.cli.service_process import Service
from powertrip.v1 import aggregator_pb2


class RoundsProgress:
    """``LocalCluster.wait_done``'s ``on_status``: what the aggregator reports, in two steps.
    First the sites registering (their workers start and load their data: minutes for a large
    data set), then the rounds, a step of ``max_rounds`` (None: a curtailment run, which ends
    when its data is used up). On a terminal each is a bar with its ETA; elsewhere a line at
    most every ``every_s`` seconds, the first of each step at once and its last. The status
    holds the latest rounds (by number: its history is bounded), so a round is shown once
    however often it is polled."""

    def __init__(
        self,
        console: Console,
        max_rounds: int | None,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.view = ProgressView(console, every_s, clock)
        self.max_rounds = max_rounds
        self.joining: Step | None = None
        self.training: Step | None = None  # from the first round: the pace is the rounds'
        self.last: aggregator_pb2.RoundSummary | None = None

    def __enter__(self) -> Self:
        self.view.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.view.__exit__(None, None, None)

    def __call__(self, st: aggregator_pb2.GetStatusResponse) -> None:
        if self.training is None and st.expected_sites:
            self._joining(st.registered_sites, st.expected_sites)
        newer = [r for r in st.rounds if self.last is None or r.round > self.last.round]
        if newer:
            self.last = newer[-1]
            self._show(self.last, ended=False)
        ended = st.state in (aggregator_pb2.RUN_STATE_DONE, aggregator_pb2.RUN_STATE_FAILED)
        if ended and self.last is not None:
            self._show(self.last, ended=True)

    def _joining(self, registered: int, expected: int) -> None:
        first = self.joining is None
        if self.joining is None:
            self.joining = self.view.step("sites registered", expected)
        elif registered == self.joining.done or self.joining.ended:
            return
        self.joining.update(registered, expected, last=registered >= expected, always=first)

    def _show(self, r: aggregator_pb2.RoundSummary, ended: bool) -> None:
        first = self.training is None
        if self.training is None:
            if self.joining is not None and not self.joining.ended:  # sites left on the way
                self.joining.update(self.joining.done, last=True)
            self.training = self.view.step("training", self.max_rounds, r.round)
        of = "" if self.max_rounds is None else f"/{self.max_rounds}"
        detail = (
            f"round {r.round}{of}, {len(r.selected_site_ids)} sites, {r.contributions} updates, "
            f"accuracy {r.accuracy:.4f}, clock {format_seconds(r.clock_seconds)}"
        )
        if r.outcome != "completed":
            detail += f", {r.outcome}"
        total = None if self.max_rounds is None else max(self.max_rounds, r.round)
        self.training.update(r.round, total, detail=detail, last=ended, always=first)


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
