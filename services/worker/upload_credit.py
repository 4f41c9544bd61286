"""The worker's side of ``UploadUpdate``: chunk bytes go out only within the credit the
aggregator granted (``services/aggregator/upload_flow.py``), so a worker never has more in
flight than its share of the aggregator's receive budget, and no less than its link needs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator

from powertrip.services.common.chunk_wire import CHUNK_TAG
from powertrip.v1 import aggregator_pb2


class Credit:
    """Bytes the worker may still send. A chunk goes once any credit is left (the balance may
    go below zero by less than one chunk, so no chunk size can stall a stream)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._available = 0
        self._over = False

    def grant(self, n: int) -> None:
        with self._cv:
            self._available += n
            self._cv.notify_all()

    def take(self, n: int) -> bool:
        """Wait for credit and spend ``n``; False once the call is over (stop sending)."""
        with self._cv:
            while self._available <= 0 and not self._over:
                self._cv.wait()
            if self._over:
                return False
            self._available -= n
            return True

    def end(self) -> None:
        with self._cv:
            self._over = True
            self._cv.notify_all()


def metered(wire: Iterable[bytes], credit: Credit) -> Iterator[bytes]:
    """``wire`` (serialized requests), each chunk request held until there is credit for it."""
    for message in wire:
        if message.startswith(CHUNK_TAG) and not credit.take(len(message)):
            return
        yield message


def upload(
    call: Callable[..., Iterator[aggregator_pb2.UploadReply]],
    wire: Iterable[bytes],
    timeout_s: float,
) -> aggregator_pb2.SubmitUpdateResponse:
    """Send ``wire`` over the ``UploadUpdate`` ``call``, spending credit as it comes; the
    aggregator's result, or its error as ``grpc.RpcError``."""
    credit = Credit()
    result = None
    try:
        # read to the end of the stream, past the result, so the call ends with its status
        # (leaving early cancels it, and the aggregator would count an upload it took as failed)
        for reply in call(metered(wire, credit), timeout=timeout_s):
            if reply.WhichOneof("part") == "credit_bytes":
                credit.grant(reply.credit_bytes)
            elif reply.WhichOneof("part") == "result":
                result = reply.result
    finally:
        credit.end()
    if result is None:
        raise RuntimeError("the aggregator ended the upload without a result")
    return result
