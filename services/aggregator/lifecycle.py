"""What the servicer and the entry point know of a run, whichever the mode: the ``Run`` protocol,
and the lifecycle both modes share (wait for the sites, train on a thread, locked status).

PowerTrip mode (``run.AggregatorRun``) and curtailment mode (``curtail_run.CurtailmentRun``)
differ only in what happens once the sites are in (``RunLifecycle._train``) and in what a
registering worker is told; the servicer maps ``Registration`` and ``StatusSnapshot`` to the wire
without knowing which mode it serves. Both modes pace an emulated run the same way
(``pacing.Pacer``, POWERTRIP_PACE).
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Protocol

from powertrip.curtailment.emissions import EnergyReport
from powertrip.learning.params import NumpyParams
from powertrip.services.aggregator import metrics
from powertrip.services.aggregator.collector import RoundGate
from powertrip.services.aggregator.config import AggregatorConfig
from powertrip.services.aggregator.executor import GrpcRoundExecutor
from powertrip.services.aggregator.pacing import Pacer
from powertrip.services.aggregator.registry import WorkerRegistry
from powertrip.services.aggregator.run_status import (
    RunState,
    RunStatus,
    StatusRound,
    StatusSnapshot,
)
from powertrip.services.aggregator.served_model import ServedModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Registration:
    """What a registering worker is told: enough to build the run's sites and data itself."""

    run_seed: int
    mode: str
    run_config_json: str = ""  # PowerTrip mode: the experiment configuration
    curtail_config_json: str = ""  # curtailment mode: the curtailment run's configuration


class UpdateIntake(Protocol):
    """Where the servicer puts a streamed update: the open round, and the model it must match."""

    @property
    def collector(self) -> RoundGate | None: ...

    @property
    def params(self) -> NumpyParams: ...


class Run(Protocol):
    """One aggregator run, in either mode, as the servicer and the entry point use it."""

    @property
    def cfg(self) -> AggregatorConfig: ...

    @property
    def registry(self) -> WorkerRegistry: ...  # who hosts which site

    @property
    def executor(self) -> UpdateIntake: ...

    @property
    def served(self) -> ServedModel: ...  # the current model, for GetModel

    def registration(self) -> Registration: ...

    def status_snapshot(
        self, after_round: int = 0, max_rounds: int | None = None
    ) -> StatusSnapshot: ...

    def start(self) -> threading.Thread: ...

    def stop(self) -> None: ...


def wait_for_sites(
    registry: WorkerRegistry, expected: int, timeout_s: float, stop: threading.Event
) -> str | None:
    """None once ``expected`` sites are registered; otherwise why not ("" when stopped)."""
    end = time.monotonic() + timeout_s
    while registry.site_count < expected:
        if stop.is_set():
            return ""
        if time.monotonic() > end:
            n = registry.site_count
            return f"only {n} of {expected} sites registered within {timeout_s:.0f} s"
        time.sleep(0.1)
    return None


class RunLifecycle:
    """The lifecycle both modes share: a thread waits for the sites, then ``_train`` runs; a
    crash or a refusal fails the run with its reason, and ``stop`` ends it at the next round
    (the executor is closed when the run's thread ends).
    A mode sets ``executor`` and ``target`` and provides the methods below that raise."""

    thread_name = "aggregator-run"

    def __init__(self, cfg: AggregatorConfig, num_sites: int, expected_sites: int) -> None:
        self.cfg = cfg
        self.registry = WorkerRegistry(num_sites, cfg.lease_s)
        self.expected_sites = expected_sites
        self.status = RunStatus()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stopping = False  # stop() was called (``_stop`` is also set by a lost quorum)
        self._pacer = Pacer(cfg.pace)
        # One meaning in both modes: NaN until the target is first reached, then the clock time.
        metrics.TIME_TO_ACCURACY.set(math.nan)

    # -- what a mode provides ------------------------------------------------------------
    executor: GrpcRoundExecutor  # PowerTrip's round executor, or curtailment's transport
    target: float | None

    @property
    def policy_name(self) -> str:
        raise NotImplementedError

    def registration(self) -> Registration:
        raise NotImplementedError

    def _train(self) -> None:
        """The run proper, on the run's thread, once the sites are in."""
        raise NotImplementedError

    # -- the shared lifecycle ------------------------------------------------------------
    def run(self) -> None:
        try:
            why = wait_for_sites(
                self.registry, self.expected_sites, self.cfg.registration_timeout_s, self._stop
            )
            if why is not None:
                if why:
                    self._fail(why)
                return
            self._train()
        except Exception as exc:
            if self._stopping:  # a mode may end its loop by raising once stopped: no failure
                logger.info("run stopped: %s", exc)
                return
            logger.exception("run crashed")
            self._fail(f"{type(exc).__name__}: {exc}")
        finally:
            self.executor.close()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=self.thread_name, daemon=True)
        thread.start()
        threading.Thread(
            target=self._sweep_leases, args=(thread,), name="lease-sweep", daemon=True
        ).start()
        return thread

    def _sweep_leases(self, run_thread: threading.Thread) -> None:
        """Notice expired leases (log, metric) a few times per lease while the run lives, so
        a dead worker is reported within about one lease even while a round blocks."""
        period = min(0.25, self.cfg.lease_s / 4)
        while run_thread.is_alive():
            self.registry.sweep()
            run_thread.join(period)

    def stop(self) -> None:
        """Start no new round; the open one runs on (the entry point may abandon it)."""
        self._stopping = True
        self._stop.set()

    def status_snapshot(
        self, after_round: int = 0, max_rounds: int | None = None
    ) -> StatusSnapshot:
        """A consistent copy of the status with one page of its rounds: those numbered above
        ``after_round``, oldest first, at most ``max_rounds`` (None: all held); copying costs
        the page, not the run."""
        with self._lock:
            st = self.status
            held = st.rounds
            start = bisect.bisect_right(held, after_round, key=lambda r: r.record.round)
            stop = len(held) if max_rounds is None else min(len(held), start + max_rounds)
            page = [held[i] for i in range(start, stop)]
            copy = replace(st, rounds=page)
            first = held[0].record.round if held else 0
        return StatusSnapshot(
            status=copy,
            target=self.target,
            registered_sites=self.registry.site_count,
            expected_sites=self.expected_sites,
            policy=self.policy_name,
            clock=self.cfg.clock,
            first_round=first,
            more_rounds=stop < len(held),
        )

    # -- status updates, from the run's thread -------------------------------------------
    def _begin_training(self) -> None:
        with self._lock:
            self.status.state = RunState.TRAINING
        self._pacer.restart()

    def _pace(self, clock_s: float) -> None:
        """Wait, once a round is fully recorded, until the run clock ``clock_s`` is due at
        POWERTRIP_PACE (``stop`` cuts the wait short)."""
        hold = self._pacer.hold_s(clock_s)
        if hold > 0:
            self._stop.wait(hold)

    def _restore_status(
        self, rows: list[StatusRound], round_index: int, accuracy: float, clock_s: float
    ) -> None:
        """A resumed run's status: the rounds its history holds, its progress at the
        checkpoint (``time_to_accuracy_s``, a checkpointed state, is set by the mode)."""
        with self._lock:
            st = self.status
            st.rounds.extend(rows)
            st.round, st.accuracy, st.clock_s = round_index, accuracy, clock_s
            st.total_rounds = len(rows)
            if st.time_to_accuracy_s is not None:
                metrics.TIME_TO_ACCURACY.set(st.time_to_accuracy_s)

    def _record_round(
        self,
        row: StatusRound,
        reached_at: float | None,
        mode: str = "",
        active_sites: int = 0,
        energy: EnergyReport | None = None,
    ) -> bool:
        """Add a finished round; True when it is the first to reach the target (``reached_at``:
        when the target was first reached, None while it is not)."""
        rec = row.record
        with self._lock:
            st = self.status
            st.round, st.accuracy, st.clock_s = rec.round, rec.accuracy, rec.time_s
            st.rounds.append(row)
            st.total_rounds += 1
            st.mode, st.active_sites, st.energy = mode, active_sites, energy
            first = False
            if st.time_to_accuracy_s is None and reached_at is not None:
                st.time_to_accuracy_s = reached_at
                metrics.TIME_TO_ACCURACY.set(reached_at)
                first = True
        return first

    def _finish(
        self, message: str, clock_s: float | None = None, energy: EnergyReport | None = None
    ) -> None:
        with self._lock:
            st = self.status
            st.state, st.message = RunState.DONE, message
            if clock_s is not None:
                st.clock_s = clock_s
            if energy is not None:
                st.energy = energy
        logger.info("run done: %s", message)

    def _fail(self, message: str) -> None:
        logger.error("run failed: %s", message)
        with self._lock:
            self.status.state, self.status.message = RunState.FAILED, message
