"""How a worker learns that its run is over, for ``POWERTRIP_EXIT_WHEN_DONE``.

Without it a worker heartbeats for as long as it lives, in case its aggregator comes back: on
Kubernetes the worker pods outlived the aggregator Job. With it, the worker asks the aggregator
for the run's state after each heartbeat and ends (exit 0) once the run is DONE. A FAILED run
keeps it beating: the orchestrator restarts the aggregator, which resumes from its checkpoint.
The aggregator with the same setting serves its DONE status for one worker lease before it
exits, so every live worker hears it (each heartbeats within a lease).
"""

from __future__ import annotations

from typing import Protocol

from powertrip.v1 import aggregator_pb2

#: above any round number: the reply carries the state and no round history
NO_ROUNDS = 2**64 - 1


class StatusStub(Protocol):
    def GetStatus(  # noqa: N802 - the gRPC method
        self, request: aggregator_pb2.GetStatusRequest, timeout: float | None = ...
    ) -> aggregator_pb2.GetStatusResponse: ...


def run_is_done(stub: StatusStub, timeout_s: float) -> bool:
    """True once the aggregator reports the run DONE; a registered worker may ask (its own
    certificate), and the reply holds no rounds."""
    ask = aggregator_pb2.GetStatusRequest(max_rounds=1, after_round=NO_ROUNDS)
    return stub.GetStatus(ask, timeout=timeout_s).state == aggregator_pb2.RUN_STATE_DONE
