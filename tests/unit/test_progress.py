"""Progress everywhere a user waits: the data loaders report through ``on_progress(done, total,
note)`` to whoever installed it (nobody by default: the library draws nothing), a slow step
reports about a thousand times however long it is, and the CLI's one renderer turns the reports
into a bar with an ETA on a terminal and into a few lines elsewhere."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from powertrip.learning.datasets import load_mnist1d, load_text
from powertrip.learning.datasets.progress import counted, progress_to, report
from powertrip.services.cli.progress import ProgressView


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _recorded() -> tuple[list[tuple[int, int, str]], object]:
    calls: list[tuple[int, int, str]] = []
    return calls, lambda done, total, note: calls.append((done, total, note))


def _steps(calls: list[tuple[int, int, str]]) -> dict[str, list[tuple[int, int]]]:
    steps: dict[str, list[tuple[int, int]]] = {}
    for done, total, note in calls:
        steps.setdefault(note, []).append((done, total))
    return steps


def test_nobody_listens_by_default_and_the_items_pass_through():
    report(1, 2, "nobody hears this")  # no callback installed: nothing happens
    assert list(counted(range(5), "five")) == [0, 1, 2, 3, 4]


def test_a_million_items_report_about_a_thousand_times_from_zero_to_the_end():
    calls, hook = _recorded()
    with progress_to(hook):
        assert sum(1 for _ in counted(range(1_000_000), "items")) == 1_000_000
    done = [d for d, _, _ in calls]
    assert done[0] == 0 and done[-1] == 1_000_000 and done == sorted(done)
    assert 1000 <= len(calls) <= 1002
    report(1, 1, "after")  # uninstalled again
    assert len(calls) <= 1002


def test_a_bpe_corpus_reports_each_step_to_its_end_and_trains_the_same_tokenizer(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("POWERTRIP_CACHE_DIR", str(tmp_path / "quiet"))
    quiet = load_text(None, context_length=16, max_samples=2000, tokenizer="bpe-300")
    monkeypatch.setenv("POWERTRIP_CACHE_DIR", str(tmp_path / "reported"))
    calls, hook = _recorded()
    with progress_to(hook):
        reported = load_text(None, context_length=16, max_samples=2000, tokenizer="bpe-300")

    steps = _steps(calls)
    assert list(steps) == [
        "synthetic corpus (bytes)",
        "BPE tokenizer (300 ids): reading text (characters)",
        "BPE tokenizer (300 ids): learning merges",
    ]
    for note, reports in steps.items():
        assert reports[0][0] == 0 and reports[-1][0] == reports[-1][1], note
        assert len(reports) <= 1002, note
    assert reported.tokenizer_sha256 == quiet.tokenizer_sha256  # progress changes nothing


def test_mnist1d_reports_its_generation_once_and_nothing_when_cached(tmp_path):
    calls, hook = _recorded()
    with progress_to(hook):
        load_mnist1d(num_samples=200, cache_dir=tmp_path)
        generated = len(calls)
        load_mnist1d(num_samples=200, cache_dir=tmp_path)
    assert generated == 2 and len(calls) == 2
    assert [(d, t) for d, t, _ in calls] == [(0, 1), (1, 1)]
    assert calls[0][2].startswith("mnist1d: generating 200 samples")


def _fsdd(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for digit in "01":
        for speaker in ("ann", "bob"):
            for index in range(6):
                path = root / "recordings" / f"{digit}_{speaker}_{index}.wav"
                path.parent.mkdir(parents=True, exist_ok=True)
                with wave.open(str(path), "wb") as fh:
                    fh.setnchannels(1)
                    fh.setsampwidth(2)
                    fh.setframerate(8000)
                    fh.writeframes((rng.normal(0, 3000, 4000)).astype(np.int16).tobytes())
    return root


@pytest.mark.extra("speech")
def test_speech_reports_its_clips_read_and_their_features(tmp_path):
    from powertrip.learning.datasets import load_speech

    calls, hook = _recorded()
    with progress_to(hook):
        load_speech(_fsdd(tmp_path), "fsdd")
    steps = _steps(calls)
    assert steps["fsdd: reading clips"][-1] == (24, 24)
    assert steps["log-mel features (clips)"][-1] == (24, 24)


def _view(terminal: bool, every_s: float = 10.0) -> tuple[ProgressView, io.StringIO, FakeClock]:
    buffer, clock = io.StringIO(), FakeClock()
    console = Console(file=buffer, force_terminal=terminal, width=120)
    return ProgressView(console, every_s=every_s, clock=clock), buffer, clock


def test_off_a_terminal_a_data_step_prints_its_start_a_line_every_few_seconds_and_its_end():
    view, buffer, clock = _view(terminal=False, every_s=10.0)
    with view:
        for done in range(0, 101):  # 100 files read in 50 s
            view.on_progress(done, 100, "fsdd: reading clips")
            clock.now += 0.5
        view.on_progress(0, 1, "BPE tokenizer (300 ids): learning merges")
        clock.now += 2.0
        view.on_progress(1, 1, "BPE tokenizer (300 ids): learning merges")

    assert buffer.getvalue().splitlines() == [
        "fsdd: reading clips: 0/100 (0 s)",
        "fsdd: reading clips: 20/100 (10 s, eta 40 s)",
        "fsdd: reading clips: 40/100 (20 s, eta 30 s)",
        "fsdd: reading clips: 60/100 (30 s, eta 20 s)",
        "fsdd: reading clips: 80/100 (40 s, eta 10 s)",
        "fsdd: reading clips: 100/100 (50 s)",
        "BPE tokenizer (300 ids): learning merges: done (2 s)",
    ]


def test_on_a_terminal_each_step_is_a_bar_with_its_eta():
    view, buffer, clock = _view(terminal=True)
    with view:
        step = view.step("fsdd: reading clips", 100)
        clock.now += 30.0
        step.update(25)
        assert view.bar is not None
        assert view.bar.tasks[0].fields["eta"] == "eta 1 min 30 s"
        view.bar.refresh()
    assert "fsdd: reading clips" in buffer.getvalue()
    assert "eta 1 min 30 s" in buffer.getvalue() and "25%" in buffer.getvalue()


def _status(rounds: range, state: int = 1, registered: int = 4) -> object:
    from powertrip.v1 import aggregator_pb2

    summaries = [
        aggregator_pb2.RoundSummary(
            round=r,
            clock_seconds=60.0 * r,
            accuracy=0.1 * r,
            contributions=3,
            selected_site_ids=["site-0", "site-1", "site-2"],
            outcome="completed",
        )
        for r in rounds
    ]
    return aggregator_pb2.GetStatusResponse(
        state=state,
        round=max(rounds, default=0),
        rounds=summaries,
        registered_sites=registered,
        expected_sites=4,
    )


def test_up_shows_the_sites_joining_then_each_round_once_at_a_bounded_rate_and_the_last():
    """``powertrip up`` polls the aggregator five times a second; the status holds the latest
    rounds, so one round arrives in many polls and many rounds in one."""
    from powertrip.services.cli.up_outputs import RoundsProgress
    from powertrip.v1 import aggregator_pb2

    clock = FakeClock()
    buffer = io.StringIO()
    with RoundsProgress(Console(file=buffer, width=200), 80, 10.0, clock) as show:
        for registered in (1, 2, 2, 4):  # the workers start and load their data
            show(_status(range(0), registered=registered))
            clock.now += 1.0
        for last in range(1, 41):  # 40 rounds, 1 s each, every round polled twice
            for _ in range(2):
                show(_status(range(max(1, last - 5), last + 1)))
            clock.now += 1.0
        show(_status(range(36, 41), aggregator_pb2.RUN_STATE_DONE))

    lines = buffer.getvalue().splitlines()
    assert lines[:2] == ["sites registered: 1/4 (0 s)", "sites registered: 4/4 (3 s)"]
    assert lines[2] == (
        "training: round 1/80, 3 sites, 3 updates, accuracy 0.1000, clock 1 min 00 s (0 s)"
    )
    shown = [int(line.split("round ")[1].split("/")[0]) for line in lines[2:]]
    assert shown == [1, 11, 21, 31, 40]  # the first at once, one every 10 s, the last
    assert lines[3].endswith("(10 s, eta 1 min 09 s)")  # rounds 2-11 in 10 s, 69 to go


def test_up_on_a_terminal_draws_the_rounds_as_a_bar_with_the_eta():
    from powertrip.services.cli.up_outputs import RoundsProgress

    clock = FakeClock()
    buffer = io.StringIO()
    with RoundsProgress(
        Console(file=buffer, force_terminal=True, width=200), 80, 10.0, clock
    ) as show:
        show(_status(range(0), registered=4))
        show(_status(range(1, 2)))
        clock.now += 30.0
        show(_status(range(1, 21)))
        assert show.view.bar is not None
        training = show.view.bar.tasks[1]
        assert training.description.startswith("training round 20/80, 3 sites")
        assert (training.completed, training.total) == (20, 80)
        assert training.fields["eta"] == "eta 1 min 35 s"  # rounds 2-20 in 30 s, 60 to go
