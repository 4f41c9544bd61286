"""Upload MiB/s: the project's upload path against a raw TCP socket and bare grpcio.

Raw TCP: 256 MiB over loopback in 4 MiB ``sendall`` writes, read with ``recv_into`` into a
preallocated buffer. Bare grpcio: one client-streaming call, bytes in and out (no serializers,
no interceptors), 2 MiB messages, a server that only counts; the client is its own process, as
the project's uploaders are. Project: ``bench_upload_rss.run_round`` (the real servicer and
``RoundCollector`` behind ``build_server``, the worker's ``GrpcUploader``), one upload for the
rate (its delta built before the clock starts, as a worker holds it) and 8 concurrent ones for
the aggregator's peak RSS. The rate row's note splits the upload: the fold after the stream ends
(the update whose turn it is folds as it arrives, so this is only its commit) and the
aggregator's CPU seconds. Over a long link (``services/netem/delay_relay.py``, 50 ms of added
round trip): one upload against bare grpcio through the same relay with a window no link here
fills, the project's credits (``UploadUpdate``) and the fixed 4 MiB window it had before.

    python benchmarks/suite/upload.py --grpc-client PORT --mib 256   (the bare grpcio client)
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc  # noqa: E402

from benchmarks.suite import MiB, Row, rate_stats, verdict  # noqa: E402

METHOD = "/bench.Sink/Upload"
GRPC_MSG = 2 * MiB
TARGET_SHARE, TARGET_RSS_X, TARGET_LINK = 0.40, 2.5, 0.80


def raw_tcp_seconds(total: int, write: int = 4 * MiB) -> float:
    """Loopback TCP, sender and receiver threads (both calls release the GIL)."""
    listener = socket.create_server(("127.0.0.1", 0))
    sink = bytearray(total)
    got = [0]

    def receive() -> None:
        conn, _ = listener.accept()
        view = memoryview(sink)
        with conn:
            while got[0] < total:
                n = conn.recv_into(view[got[0] :], min(write, total - got[0]))
                if n == 0:
                    break
                got[0] += n

    rx = threading.Thread(target=receive)
    rx.start()
    chunk = memoryview(bytes(write))
    with socket.create_connection(listener.getsockname()) as s:
        start = time.perf_counter()
        for off in range(0, total, write):
            s.sendall(chunk[: min(write, total - off)])
        rx.join()
        elapsed = time.perf_counter() - start
    listener.close()
    if got[0] != total:
        raise RuntimeError(f"raw TCP received {got[0]} of {total} bytes")
    return elapsed


def grpc_client(port: int, mib: int) -> None:
    """The bare grpcio client (child process): prints the call's seconds."""
    opts = [("grpc.max_send_message_length", 8 * MiB)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=opts) as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
        call = ch.stream_unary(METHOD)  # no serializers: bytes as they are
        msg = bytes(GRPC_MSG)
        count = mib * MiB // GRPC_MSG
        start = time.perf_counter()
        reply = call(iter([msg] * count), timeout=600)
        print(time.perf_counter() - start, int(reply.decode()), flush=True)


def sink_server(options: Sequence[tuple[str, int]] = ()) -> tuple[grpc.Server, int]:
    """A bare grpcio server (no project code) whose ``METHOD`` counts the bytes streamed to it
    and answers the count; extra channel ``options`` (HTTP/2 window settings) on top of an
    8 MiB message limit. (server, port), started."""

    def upload(requests: Any, context: grpc.ServicerContext) -> bytes:
        total = 0
        for m in requests:
            total += len(m)
        return str(total).encode()

    handler = grpc.method_handlers_generic_handler(
        "bench.Sink", {"Upload": grpc.stream_unary_rpc_method_handler(upload)}
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        handlers=[handler],
        options=[("grpc.max_receive_message_length", 8 * MiB), *options],
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def bare_grpc_seconds(mib: int) -> float:
    server, port = sink_server()
    try:
        cmd = [sys.executable, __file__, "--grpc-client", str(port), "--mib", str(mib)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True).stdout
        seconds, received = out.split()
        if int(received) != mib * MiB:
            raise RuntimeError(f"bare grpcio received {received} bytes of {mib * MiB}")
        return float(seconds)
    finally:
        server.stop(None)


def project_round(mib: int, uploads: int, client_procs: int, rtt_ms: float = 0.0) -> dict[str, Any]:
    from bench_upload_rss import run_round

    args = argparse.Namespace(
        model_mib=mib,
        tensors=4,
        uploads=uploads,
        timeout=600.0,
        client_procs=client_procs,
        rtt_ms=rtt_ms,
    )
    r = run_round("streaming", args)
    if r["errors"]:  # a transport error (a loaded machine): once more; a wrong model is not retried
        print(f"project upload retried once after: {r['errors']}", file=sys.stderr)
        r = run_round("streaming", args)
    if not r["correct"] or r["errors"] or not r["complete"]:
        raise RuntimeError(f"project upload failed or the model is wrong: {r['errors']}")
    return r


def long_link_rows(mib: int, rtt_ms: float) -> list[Row]:
    """One upload through the delay relay: the project (credits sized to the link) and, as it
    was, a fixed 4 MiB window, against the ceiling: bare grpcio through the same relay with a
    window no link here fills (256 MiB)."""
    from bench_stream_window import upload_mib_s

    logging.getLogger("powertrip.services.netem.delay_relay").setLevel(logging.ERROR)  # "no netem"
    big = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 256 * MiB)]
    ceiling = upload_mib_s(big, rtt_ms / 1000, mib)
    proj = mib / project_round(mib, 1, 1, rtt_ms)["upload_s"]
    os.environ["BENCH_WINDOW_MIB"] = "4"  # the server as it shipped before the credits
    try:
        fixed = mib / project_round(mib, 1, 1, rtt_ms)["upload_s"]
    finally:
        del os.environ["BENCH_WINDOW_MIB"]
    name = f"upload {mib} MiB over {rtt_ms:g} ms RTT"
    return [
        Row(
            f"{name}: project vs relay ceiling",
            proj,
            "MiB/s",
            ceiling,
            "bare grpcio, 256 MiB window",
            proj / ceiling,
            f">= {TARGET_LINK:.0%}",
            verdict(proj / ceiling >= TARGET_LINK),
            note="credits from the budget (no measured link here: the whole budget for one "
            "upload); the delay relay stands in for netem",
        ),
        Row(
            f"{name}: fixed 4 MiB window (before) vs relay ceiling",
            fixed,
            "MiB/s",
            ceiling,
            "bare grpcio, 256 MiB window",
            fixed / ceiling,
        ),
    ]


def run(quick: bool, ctx: dict[str, Any]) -> list[Row]:
    mib, uploads, repeats = (16, 2, 1) if quick else (256, 8, 3)
    tcp_s, bare_s, ones = [], [], []
    for _ in range(repeats):  # interleaved, so load changes hit every path alike
        tcp_s.append(raw_tcp_seconds(mib * MiB))
        bare_s.append(bare_grpc_seconds(mib))
        ones.append(project_round(mib, 1, 1))
    tcp, tcp_spread = rate_stats(mib, tcp_s)
    bare, bare_spread = rate_stats(mib, bare_s)
    proj, proj_spread = rate_stats(mib, [o["upload_s"] for o in ones])
    one = sorted(ones, key=lambda o: o["upload_s"])[len(ones) // 2]  # the median upload's split
    many = project_round(mib, uploads, 2)
    x = (many["peak_mib"] - many["rss_pre_mib"]) / many["model_mib"]
    return [
        Row(
            f"upload {mib} MiB: project vs raw TCP",
            proj,
            "MiB/s",
            tcp,
            "raw TCP loopback",
            proj / tcp,
            f">= {TARGET_SHARE:.0%}",
            verdict(proj / tcp >= TARGET_SHARE),
            spread=proj_spread,
            note=f"median of {repeats} uploads, insecure loopback; {one['upload_s']:.2f} s of "
            f"which the fold after the stream {one['fold_s']:.2f} s; aggregator CPU "
            f"{one['cpu_s']:.2f} s; raw TCP [{tcp_spread[0]:,.0f}-{tcp_spread[1]:,.0f}] MiB/s",
        ),
        Row(
            f"upload {mib} MiB: bare grpcio vs raw TCP (ceiling)",
            bare,
            "MiB/s",
            tcp,
            "raw TCP loopback",
            bare / tcp,
            spread=bare_spread,
        ),
        Row(
            f"upload {mib} MiB: project vs bare grpcio",
            proj,
            "MiB/s",
            bare,
            "bare grpcio",
            proj / bare,
            spread=proj_spread,
        ),
        Row(
            f"aggregator peak RSS, {uploads} x {mib} MiB concurrent uploads",
            x,
            "x model",
            target=f"<= {TARGET_RSS_X}x",
            verdict=verdict(x <= TARGET_RSS_X),
            note=f"{uploads * mib / many['upload_s']:.0f} MiB/s aggregate over "
            f"{many['upload_s']:.1f} s",
        ),
        *long_link_rows(mib // 2 if quick else 128, 50.0),
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpc-client", type=int, required=True)
    ap.add_argument("--mib", type=int, default=256)
    a = ap.parse_args()
    grpc_client(a.grpc_client, a.mib)
