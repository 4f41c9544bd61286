"""Test hook: named places where a process SIGKILLs itself, to prove crash recovery.

``POWERTRIP_FAULT_INJECT=checkpoint-write@3`` makes the aggregator (``upload@3``: a worker)
kill itself (SIGKILL: no handler, no ``finally``, no flush, as an OOM kill or a power loss
would) the first time it reaches the point ``checkpoint-write`` in round 3 or later (a worker
that joins late still dies at its first upload). Several points:
comma-separated. The crash tests (``tests/integration/test_crash_recovery.py``,
``test_liveness.py``) use it to kill a process at exact moments a test cannot hit from outside
(half-way through a fold, between two files of a checkpoint, in the middle of an upload).

It is a test hook, never part of a production configuration. Unset, ``fault_point`` is a dict
lookup. An unknown point name is a ``ConfigError`` at the service's start (``armed_faults``),
so a typo cannot leave a crash test silently testing nothing.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping

from powertrip.services.common.config import ConfigError

VARIABLE = "POWERTRIP_FAULT_INJECT"
#: where the points are, and what a crash there leaves behind
POINTS = {
    # RoundCollector: the round's first update is folded into the sums, the others not yet
    "aggregation": "collector.RoundCollector._changed",
    # checkpoint.save: the new model file and the manifest's temporary file are written and
    # fsynced, the manifest not yet renamed into place (the round is not committed)
    "checkpoint-write": "checkpoint.save",
    # checkpoint.save: the manifest renamed into place, the directory not yet fsynced and the
    # old rounds not yet pruned
    "checkpoint-commit": "checkpoint.save",
    # the aggregator's executor: a worker accepted the round's model and trains it, the round
    # is in flight (no update folded yet)
    "broadcast": "executor.GrpcRoundExecutor.send_round",
    # the aggregator's executor: the round's new model is built and evaluated in memory, not
    # yet recorded, journaled or checkpointed
    "evaluation": "executor.GrpcRoundExecutor.execute",
    # the aggregator's run: restored from the checkpoint of round R - 1, SERVING, its sites
    # registered again, no round started (a crash loop at resume)
    "resumed": "run.AggregatorRun._train",
    # the worker's uploader: the update's header and first chunk handed to gRPC (and given a
    # moment to leave), the rest of the stream not: the aggregator sees a stream cut mid-way
    "upload": "uploader.update_wire",
}

_armed: dict[str, int] | None = None


def parse(value: str) -> dict[str, int]:
    """``"aggregation@2,checkpoint-write@3"`` -> ``{"aggregation": 2, ...}``; ConfigError
    naming the variable for an unknown point or a malformed entry."""
    armed: dict[str, int] = {}
    for entry in filter(None, (e.strip() for e in value.split(","))):
        name, at, round_text = entry.partition("@")
        if name not in POINTS:
            known = ", ".join(sorted(POINTS))
            raise ConfigError(f"{VARIABLE}={value!r}: unknown point {name!r} (known: {known})")
        if not at or not round_text.isdigit():
            raise ConfigError(f"{VARIABLE}={value!r}: write POINT@ROUND, e.g. {name}@3")
        armed[name] = int(round_text)
    return armed


def armed_faults(env: Mapping[str, str] | None = None) -> dict[str, int]:
    """The armed points (read once from the environment); call it at start to fail fast."""
    global _armed
    if env is not None:
        return parse(env.get(VARIABLE, ""))
    if _armed is None:
        _armed = parse(os.environ.get(VARIABLE, ""))
    return _armed


def fault_point(name: str, round: int, settle_s: float = 0.0) -> None:  # noqa: A002
    """SIGKILL this process if ``name`` is armed for ``round`` or an earlier one; otherwise
    nothing. ``settle_s``: wait
    that long first, so that bytes already handed to a socket reach the peer."""
    armed = armed_faults().get(name)
    if armed is not None and round >= armed:
        time.sleep(settle_s)
        os.kill(os.getpid(), signal.SIGKILL)
