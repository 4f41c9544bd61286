"""Application-level latency emulator: a TCP relay that holds every chunk for a one-way delay.

Used where the kernel has no netem (tc-scripts/shape.sh says so and points here). Each
direction of a relayed connection is a delay line: a reader stamps every chunk with
``arrival + delay`` and keeps reading, a writer sends the chunks in order once their time has
come. Reading never waits for earlier chunks to be released, so the relay adds latency without
capping throughput (up to ``buffer_bytes`` in flight per direction, then it pushes back).

What it does not emulate: the relay terminates TCP, so each side's congestion control sees a
short loopback RTT, not the emulated one (no slow start stretched over a long RTT). Probes that
time request/response exchanges, such as the profiler's RTT estimate, see the delay exactly.

    python -m powertrip.services.netem.delay_relay --listen 127.0.0.1:0 --target host:port \
        --delay-ms 40
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections import deque
from collections.abc import Sequence

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
DEFAULT_BUFFER_BYTES = 16 * 1024 * 1024


class _DelayLine:
    """FIFO of (release time, chunk) with a byte budget; None marks the sender's EOF."""

    def __init__(self, limit_bytes: int) -> None:
        self._items: deque[tuple[float, bytes | None]] = deque()
        self._bytes = 0
        self._limit = limit_bytes
        self._changed = asyncio.Condition()

    async def put(self, release_at: float, chunk: bytes | None) -> None:
        async with self._changed:
            # A chunk larger than the whole budget still goes through once the line is empty.
            await self._changed.wait_for(lambda: self._bytes < self._limit)
            self._items.append((release_at, chunk))
            self._bytes += len(chunk or b"")
            self._changed.notify_all()

    async def get(self) -> tuple[float, bytes | None]:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            release_at, chunk = self._items.popleft()
            self._bytes -= len(chunk or b"")
            self._changed.notify_all()
            return release_at, chunk


async def _delay_direction(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    delay_s: float,
    buffer_bytes: int,
) -> None:
    loop = asyncio.get_running_loop()
    line = _DelayLine(buffer_bytes)

    async def ingest() -> None:
        while chunk := await reader.read(CHUNK_BYTES):
            await line.put(loop.time() + delay_s, chunk)
        await line.put(loop.time() + delay_s, None)

    async def release() -> None:
        while True:
            release_at, chunk = await line.get()
            await asyncio.sleep(max(0.0, release_at - loop.time()))
            if chunk is None:
                if writer.can_write_eof():
                    writer.write_eof()  # half-close, so request/response-then-EOF peers work
                return
            writer.write(chunk)
            await writer.drain()

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(ingest())
        tasks.create_task(release())


class DelayRelay:
    """Listens on ``listen``, connects each client to ``target``, delays both directions."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        delay_s: float,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    ) -> None:
        if delay_s < 0:
            raise ValueError(f"delay must be >= 0 s, got {delay_s}")
        if buffer_bytes <= 0:
            raise ValueError(f"buffer must be > 0 bytes, got {buffer_bytes}")
        self.target = (target_host, target_port)
        self.delay_s = delay_s
        self.buffer_bytes = buffer_bytes

    async def start(self, host: str, port: int) -> asyncio.Server:
        server = await asyncio.start_server(self._handle, host, port)
        bound = server.sockets[0].getsockname()
        log.warning(
            "netem unavailable: emulating %g ms one-way delay in the application-level relay "
            "(%s:%d -> %s:%d, so %g ms added to every round trip)",
            self.delay_s * 1e3,
            bound[0],
            bound[1],
            *self.target,
            2 * self.delay_s * 1e3,
        )
        return server

    async def _handle(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        peer = client_writer.get_extra_info("peername")
        try:
            target_reader, target_writer = await asyncio.open_connection(*self.target)
        except OSError as err:
            log.error("relay: cannot reach target %s:%d for %s: %s", *self.target, peer, err)
            client_writer.close()
            return
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(
                    _delay_direction(client_reader, target_writer, self.delay_s, self.buffer_bytes)
                )
                tasks.create_task(
                    _delay_direction(target_reader, client_writer, self.delay_s, self.buffer_bytes)
                )
        except* (ConnectionError, OSError) as errors:
            log.info("relay: connection %s closed: %s", peer, errors.exceptions[0])
        finally:
            for writer in (client_writer, target_writer):
                writer.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await writer.wait_closed()


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


async def _serve(listen: tuple[str, int], relay: DelayRelay) -> None:
    server = await relay.start(*listen)
    # The bound port alone on stdout, so a harness can start with port 0 and read it back.
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m powertrip.services.netem.delay_relay", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--listen", type=_host_port, required=True, help="HOST:PORT (port 0: any)")
    parser.add_argument("--target", type=_host_port, required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay per chunk")
    parser.add_argument(
        "--buffer-bytes",
        type=int,
        default=DEFAULT_BUFFER_BYTES,
        help="bytes held per direction before the relay stops reading",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    try:
        host, port = args.target
        relay = DelayRelay(host, port, args.delay_ms / 1e3, args.buffer_bytes)
    except ValueError as err:
        parser.error(str(err))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.listen, relay))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
