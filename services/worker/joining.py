"""How a worker joins its run: registration that waits out refusals (one line each), and the
sites built (or rebuilt from a saved run) before the worker registers as ready."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeGuard

import grpc

from powertrip.services.worker.config import WorkerConfig
from powertrip.services.worker.run_mode import host_for_reply, partition_host
from powertrip.services.worker.runner import RoundRunner
from powertrip.services.worker.state_dir import SavedRun, WorkerStateDir
from powertrip.v1 import aggregator_pb2

logger = logging.getLogger("powertrip.services.worker")

#: registration refusals a worker waits out instead of exiting: a supervisor restarting it would
#: change nothing, while the operator may fix the site owners map or a squatter may go away
REFUSED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ALREADY_EXISTS)


class RefusalLog:
    """Logs each distinct refusal once (a refused worker retries every few seconds, for hours)."""

    def __init__(self, limit: int = 64) -> None:
        self.seen: set[str] = set()
        self.limit = limit

    def __call__(self, what: str, exc: grpc.RpcError, retry_s: float) -> None:
        message = f"{exc.code().name}: {exc.details()}"
        if message in self.seen:
            return
        if len(self.seen) >= self.limit:
            self.seen.clear()
        self.seen.add(message)
        logger.error(
            "%s refused by the aggregator (%s); retrying every %g s", what, message, retry_s
        )


def refused(exc: BaseException) -> TypeGuard[grpc.RpcError]:
    return isinstance(exc, grpc.RpcError) and exc.code() in REFUSED


def join(
    register: Callable[[bool], aggregator_pb2.RegisterWorkerResponse], ready: bool, retry_s: float
) -> aggregator_pb2.RegisterWorkerResponse:
    """Register, waiting out refusals (one line each) without exiting; other errors raise."""
    log = RefusalLog()
    while True:
        try:
            reply = register(ready)
        except grpc.RpcError as exc:
            if not refused(exc):
                raise
            log("registration", exc, retry_s)
            time.sleep(retry_s)
            continue
        if log.seen:
            logger.info("registration accepted after %d refusal message(s)", len(log.seen))
        return reply


def join_run(
    register: Callable[[bool], aggregator_pb2.RegisterWorkerResponse],
    runner: RoundRunner,
    cfg: WorkerConfig,
    device: str,
    state: WorkerStateDir | None,
) -> None:
    """Build the sites and register as ready. A worker restarted with a state directory
    rebuilds them from the saved run before it reaches the aggregator and registers as ready at
    once, so the sites never leave the selection; a fresh one fetches the run first
    (registering as not ready: rounds wait), and saves it. The hosts code their updates with
    the run's codec (its configuration names it)."""
    saved = state.saved_run() if state is not None else None
    if saved is not None and state is not None:
        runner.start(partition_host(saved, cfg, device, state))
        logger.info("rebuilt run %s's sites from %s; rejoining", saved.identity, state.directory)
        reply = join(register, True, cfg.heartbeat_s)
        if reply.mode != "curtailment" and saved == SavedRun(reply.run_config_json, reply.run_seed):
            return
        logger.warning(
            "%s holds another run than the aggregator's: starting fresh", state.directory
        )
        runner.start(None)  # Busy until rebuilt
        state.forget()
    reply = join(register, False, cfg.heartbeat_s)  # the run config first; rounds wait
    runner.start(host_for_reply(reply, cfg, device, state))
    join(register, True, cfg.heartbeat_s)
