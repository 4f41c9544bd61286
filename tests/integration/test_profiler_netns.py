"""The profiler measures a real, shaped link.

A worker's WorkerService runs inside its own network namespace behind a veth pair shaped with
tbf at 50 Mbit/s (tc-scripts/shape.sh, both ends). From the root namespace the profiler's
LinkProber measures it:

* bandwidth: the smoothed estimate is within ±10% of 50 Mbit/s. The probe counts gRPC payload
  bytes, so it sits below the line rate by the TCP/IP and Ethernet headers (~4%: 1448 payload
  bytes per 1514-byte frame) plus HTTP/2 framing; divided by the payload's share of the bytes tbf
  sent (its qdisc counters), it is the shaped rate within ±5%;
* RTT: with the application-level delay relay (this kernel has no netem) in front of the worker
  at 20 ms and then 60 ms one way, the measured RTT rises by 2 x 40 ms (±20%), and the relay
  says in its log that it, not netem, adds the delay.

Needs root and a working ``ip netns``; skipped with the reason otherwise. Everything it creates
has the test process's pid in its name and is removed in a finalizer.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from powertrip.services.profiler.config import ProfilerConfig
from powertrip.services.profiler.servicer import LinkProber

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ROOT / "tc-scripts" / "shape.sh"
RATE_BIT_S = 50e6
PROBE_BYTES = 16 << 20  # ~2.7 s at 50 Mbit/s: the tbf burst (25 kB) and one RTT are noise
DELAYS_MS = (20.0, 60.0)

WORKER_SCRIPT = """
import sys
from powertrip.v1 import worker_pb2_grpc
from powertrip.services.common.config import ServiceConfig
from powertrip.services.common.grpc_server import build_server
from powertrip.services.worker.servicer import WorkerServicer

servicer = WorkerServicer(runner=None, hosted=[])  # answers Ping and ProbeBandwidth only
server, port, _ = build_server(
    [lambda s: worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, s)],
    sys.argv[1],
    ServiceConfig(insecure=True),
)
server.start()
print(f"READY {port}", flush=True)
server.wait_for_termination()
"""


def _why_no_netns() -> str | None:
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create a network namespace"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = f"ptprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` does not work here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


WHY_NOT = _why_no_netns()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


def run(*cmd: str, **env: str) -> str:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=30
    )
    assert proc.returncode == 0, f"{' '.join(cmd)} failed: {proc.stderr.strip()}"
    return proc.stdout


def read_line(proc: subprocess.Popen, timeout_s: float = 15.0) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"{proc.args} printed nothing within {timeout_s} s"
    line = proc.stdout.readline().strip()
    assert line, f"{proc.args} exited ({proc.poll()}) before printing its port"
    return line


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'protos'}"}


@dataclass(frozen=True)
class ShapedWorker:
    address: str  # host:port as seen from the root namespace
    ns: str
    ns_if: str

    def sent_bytes(self) -> int:
        """Bytes the worker's side of the link has put on the wire (tc qdisc counters)."""
        stats = run("ip", "netns", "exec", self.ns, "tc", "-s", "qdisc", "show", "dev", self.ns_if)
        return int(re.search(r"Sent (\d+) bytes", stats).group(1))


@pytest.fixture
def procs() -> list[subprocess.Popen]:
    """Processes of this test (worker, relays); shaped_worker's finalizer stops them first."""
    return []


@pytest.fixture
def shaped_worker(tmp_path, request, procs) -> ShapedWorker:
    """A probe-answering worker in namespace ptprof<pid>, behind a 50 Mbit/s tbf veth."""
    pid = os.getpid()
    ns, host_if, ns_if = f"ptprof{pid}", f"ptp{pid}h", f"ptp{pid}n"
    # one /30 per pid in 10.128.0.0/10, inside namespaces this test makes and removes
    base = f"10.{128 + (pid >> 14) % 64}.{(pid >> 6) % 256}"
    host_ip, ns_ip = f"{base}.{(pid % 64) * 4 + 1}", f"{base}.{(pid % 64) * 4 + 2}"

    def teardown() -> None:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # takes its veth end
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)  # if ns never got it

    request.addfinalizer(teardown)
    run("ip", "netns", "add", ns)
    run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
    run("ip", "link", "set", ns_if, "netns", ns)
    run("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
    run("ip", "link", "set", host_if, "up")
    run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
    run("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up")
    run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    # traffic to the worker must leave through our veth and nowhere else
    assert f"dev {host_if}" in run("ip", "route", "get", ns_ip)
    # both directions at 50 Mbit/s; the bulk probe flows worker -> profiler (ns_if egress)
    run(str(SHAPE), "apply", host_if, RATE="50mbit")
    run("ip", "netns", "exec", ns, str(SHAPE), "apply", ns_if, RATE="50mbit")
    assert "tbf" in run("ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", ns_if)

    script = tmp_path / "probe_worker.py"
    script.write_text(WORKER_SCRIPT)
    worker = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, str(script), f"{ns_ip}:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    procs.append(worker)
    port = read_line(worker).removeprefix("READY ")
    return ShapedWorker(f"{ns_ip}:{port}", ns, ns_if)


@pytest.fixture
def start_relay(shaped_worker, procs, tmp_path):
    """start_relay(delay_ms) -> ("127.0.0.1:port", stderr log path) of a delay relay in the
    root namespace in front of the shaped worker."""
    host, port = shaped_worker.address.rsplit(":", 1)

    def start(delay_ms: float) -> tuple[str, Path]:
        log = tmp_path / f"relay-{delay_ms:g}ms.log"
        relay = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "powertrip.services.netem.delay_relay",
                "--listen",
                "127.0.0.1:0",
                "--target",
                f"{host}:{port}",
                "--delay-ms",
                f"{delay_ms:g}",
            ],
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
            env=subprocess_env(),
        )
        procs.append(relay)
        return f"127.0.0.1:{read_line(relay)}", log

    return start


@pytest.mark.reliability("R4", "R5")
def test_bandwidth_within_10_percent_of_tbf_and_rtt_follows_injected_delay(
    shaped_worker, start_relay
):
    started = time.monotonic()
    prober = LinkProber(
        ProfilerConfig(insecure=True, ping_count=9, probe_bytes=PROBE_BYTES, smoothing=0.5)
    )
    prober.track("netns-worker", shaped_worker.address, [0])
    wire_before = shaped_worker.sent_bytes()
    prober.measure()
    prober.measure()  # two probes, smoothed: the estimate the ranking would use
    direct = prober.link("netns-worker")
    payload_share = 2 * PROBE_BYTES / (shaped_worker.sent_bytes() - wire_before)

    # RTT only through the relays: a zero byte budget turns every probe into pings
    pinger = LinkProber(ProfilerConfig(insecure=True, ping_count=9, probe_budget_bytes_per_hour=0))
    rtt_ms = {}
    logs = {}
    for delay in DELAYS_MS:
        address, logs[delay] = start_relay(delay)
        pinger.track(f"via-{delay:g}ms", address, [0])
        pinger.measure([f"via-{delay:g}ms"])
        link = pinger.link(f"via-{delay:g}ms")
        assert link.bandwidth_probes == 0 and link.probes == 1
        rtt_ms[delay] = link.rtt_s * 1e3
    elapsed = time.monotonic() - started

    mbit = direct.bandwidth_bytes_per_s * 8 / 1e6
    rise = rtt_ms[DELAYS_MS[1]] - rtt_ms[DELAYS_MS[0]]
    expected_rise = 2 * (DELAYS_MS[1] - DELAYS_MS[0])
    print(
        f"\nshaped 50 Mbit/s: measured {mbit:.2f} Mbit/s ({mbit / 50:.1%}) of gRPC payload, "
        f"which is {payload_share:.1%} of the bytes tbf sent, i.e. "
        f"{mbit / payload_share:.2f} Mbit/s on the wire; "
        f"direct RTT {direct.rtt_s * 1e3:.2f} ms; relay RTT {rtt_ms[20.0]:.1f} ms at 20 ms "
        f"one way, {rtt_ms[60.0]:.1f} ms at 60 ms: +{rise:.1f} ms for +{expected_rise:g} ms "
        f"injected; probes took {elapsed:.1f} s"
    )
    assert direct.bandwidth_probes == 2
    assert direct.bandwidth_bytes_per_s * 8 == pytest.approx(RATE_BIT_S, rel=0.10)
    # the shortfall is the headers: on the wire the link ran at its shaped rate
    assert direct.bandwidth_bytes_per_s * 8 / payload_share == pytest.approx(RATE_BIT_S, rel=0.05)
    assert direct.rtt_s < 0.010  # the veth itself adds no delay
    for delay in DELAYS_MS:
        assert rtt_ms[delay] == pytest.approx(2 * delay + direct.rtt_s * 1e3, rel=0.20)
        text = logs[delay].read_text()
        assert f"netem unavailable: emulating {delay:g} ms one-way delay" in text
    assert rise == pytest.approx(expected_rise, rel=0.20)
