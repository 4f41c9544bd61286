"""One gRPC upload stream over a long link: throughput against the server's HTTP/2 window.

HTTP/2 flow control lets a sender have at most one receive window of bytes in flight, so one
stream moves at most ``window / RTT``. The services fix the window (``POWERTRIP_STREAM_WINDOW_MIB``,
4 MiB) instead of gRPC's BDP probing because every concurrent upload can buffer a window in the
aggregator (``bench_upload_rss.py``); this benchmark measures what that costs on a wide-area
path. A bare grpcio stream-unary call (512 KiB messages, the services' chunk size) goes through
``services/netem/delay_relay.py`` (this kernel has no netem) with ``--rtt-ms`` of added round
trip, once per window size and once with gRPC's default BDP probing; the same client, server
and relay every time, so read the ratios between rows.

    .venv/bin/python benchmarks/bench_stream_window.py [--rtt-ms 50,100] [--windows 4,16,64]
        [--mib 128]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.suite import MiB  # noqa: E402
from benchmarks.suite.upload import METHOD, sink_server  # noqa: E402
from powertrip.services.common.tensor_stream import DEFAULT_CHUNK_BYTES as CHUNK  # noqa: E402
from powertrip.services.netem.delay_relay import DelayRelay  # noqa: E402


@contextmanager
def delay_relay(port: int, one_way_s: float) -> Iterator[int]:
    """A delay relay in front of ``port`` on its own event loop thread; yields its port."""
    loop = asyncio.new_event_loop()
    relay = DelayRelay("127.0.0.1", port, one_way_s, buffer_bytes=1 << 30)
    server = loop.run_until_complete(relay.start("127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, name="relay", daemon=True)
    thread.start()

    async def shut() -> None:
        server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        asyncio.run_coroutine_threadsafe(shut(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def upload_mib_s(options: list[tuple[str, int]], rtt_s: float, mib: int) -> float:
    """MiB/s of one ``mib`` MiB upload on a warm connection through the relay."""
    server, port = sink_server(options)
    with delay_relay(port, rtt_s / 2) as relay_port:
        try:  # both ends close before the relay does, so its connections end on their own
            with grpc.insecure_channel(f"127.0.0.1:{relay_port}") as channel:
                call = channel.stream_unary(METHOD)
                payload = b"\0" * CHUNK
                call(iter([payload] * 2))  # connect and warm up
                start = time.perf_counter()
                received = int(call(iter([payload] * (mib * MiB // CHUNK))))
                seconds = time.perf_counter() - start
        finally:
            server.stop(None)
    if received != mib * MiB // CHUNK * CHUNK:
        raise RuntimeError(f"the server received {received} bytes")
    return received / MiB / seconds


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtt-ms", default="50,100", help="comma-separated added round trips")
    ap.add_argument("--windows", default="4,16,64", help="comma-separated fixed windows, MiB")
    ap.add_argument("--mib", type=int, default=128, help="upload size per measurement")
    args = ap.parse_args(argv)
    logging.getLogger("powertrip.services.netem.delay_relay").setLevel(
        logging.ERROR
    )  # "no netem": known
    rtts = [float(r) for r in args.rtt_ms.split(",")]
    windows = [int(w) for w in args.windows.split(",")]
    if args.mib < 1 or min(rtts) < 0 or min(windows) < 1:
        ap.error("--mib and --windows must be >= 1 and --rtt-ms >= 0")
    settings = {
        f"window {w} MiB": [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", w * MiB)]
        for w in windows
    } | {"gRPC default (BDP probing)": []}
    print(f"one {args.mib} MiB stream, {CHUNK // 1024} KiB messages, through the delay relay")
    print(f"{'rtt ms':>7}  {'server window':<28} {'MiB/s':>7} {'Mbit/s':>7}  window/RTT bound")
    for rtt in rtts:
        for name, options in settings.items():
            rate = upload_mib_s(options, rtt / 1000, args.mib)
            window = next((v for k, v in options if k == "grpc.http2.lookahead_bytes"), None)
            bound = f"{window / MiB / (rtt / 1000):.0f} MiB/s" if window and rtt else "-"
            print(f"{rtt:>7.0f}  {name:<28} {rate:>7.0f} {rate * 8 * MiB / 1e6:>7.0f}  {bound}")


if __name__ == "__main__":
    main()
