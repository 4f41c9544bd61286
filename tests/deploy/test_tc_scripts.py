"""tc-scripts/: shape.sh (one interface) and topology.sh (hub + sites in network namespaces).

Static checks run everywhere. The rest needs root and `ip netns`; it builds throw-away
namespaces whose names carry this process's pid, so parallel runs never collide, and removes
them in fixture finalizers. Every link lives inside namespaces, never in the caller's.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tc-scripts"
SHAPE = SCRIPTS / "shape.sh"
TOPOLOGY = SCRIPTS / "topology.sh"
PID = os.getpid()
SHAPED_MBIT = 50.0
PAYLOAD_BYTES = 4_000_000  # ~0.65 s at 50 Mbit/s: long enough that the tbf bucket is noise


def run(*cmd: str | Path, env: dict[str, str] | None = None, timeout: float = 30):
    return subprocess.run(
        [str(c) for c in cmd],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def netns_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    probe = f"ptprobe{PID}"
    if run("ip", "netns", "add", probe).returncode != 0:
        return False
    run("ip", "netns", "del", probe)
    return True


def kernel_has_netem() -> bool:
    """Probed in a namespace that dies with the command, like shape.sh does."""
    probe = run(
        "unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"
    )
    return probe.returncode == 0


NETNS = netns_usable()
needs_root = pytest.mark.skipif(not NETNS, reason="needs root and a working `ip netns`")
NETEM = NETNS and kernel_has_netem()


# ---------------------------------------------------------------------------- static checks


def test_every_script_parses():
    scripts = sorted(SCRIPTS.glob("*.sh"))
    assert {SHAPE, TOPOLOGY} <= set(scripts)
    for script in scripts:
        proc = run("bash", "-n", script)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"


def test_every_script_is_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck)")
    proc = run("shellcheck", *sorted(SCRIPTS.glob("*.sh")))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_scripts_are_executable():
    for script in (SHAPE, TOPOLOGY):
        assert os.access(script, os.X_OK), script.name


@pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 (`ip`) is not installed")
def test_shaping_an_interface_that_does_not_exist_is_a_clear_error():
    proc = run(SHAPE, "apply", f"ptnone{PID}", env={"RATE": "50mbit"})
    assert proc.returncode == 1
    assert f"no such interface 'ptnone{PID}'" in proc.stderr
    assert proc.stdout == ""


def test_shape_without_arguments_prints_usage():
    proc = run(SHAPE)
    assert proc.returncode == 2
    assert "shape.sh apply <iface>" in proc.stderr


def test_a_malformed_profile_line_is_named(tmp_path):
    profile = tmp_path / "bad.env"
    profile.write_text("RATE=50mbit\nthis is not a setting\n")
    proc = run(SHAPE, "apply", "lo", "--profile", profile)
    assert proc.returncode == 2
    assert f"{profile}:2: expected KEY=VALUE" in proc.stderr


def test_topology_without_arguments_prints_usage():
    proc = run(TOPOLOGY)
    assert proc.returncode == 2
    assert "topology.sh up" in proc.stderr


# ------------------------------------------------------------------- one shaped veth (root)


class Link:
    """Sender namespace --veth--> receiver namespace, 10.213.0.1/30 -> 10.213.0.2/30."""

    def __init__(self) -> None:
        self.tx_ns, self.rx_ns = f"ptx{PID}", f"prx{PID}"
        self.tx_if, self.rx_if = f"ptx{PID}", f"prx{PID}"
        self.tx_ip, self.rx_ip = "10.213.0.1", "10.213.0.2"

    def shape(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """shape.sh ARGS on the sender's end, run inside its namespace."""
        return run("ip", "netns", "exec", self.tx_ns, SHAPE, *args, env=env)

    def qdiscs(self) -> str:
        return run("tc", "-n", self.tx_ns, "qdisc", "show", "dev", self.tx_if).stdout


@pytest.fixture(scope="module")
def link() -> Iterator[Link]:
    if not NETNS:
        pytest.skip("needs root and a working `ip netns`")
    link = Link()
    try:
        for ns in (link.tx_ns, link.rx_ns):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(
            [
                "ip",
                "link",
                "add",
                link.tx_if,
                "netns",
                link.tx_ns,
                "type",
                "veth",
                "peer",
                "name",
                link.rx_if,
                "netns",
                link.rx_ns,
            ],
            check=True,
        )
        for ns, iface, ip in (
            (link.tx_ns, link.tx_if, link.tx_ip),
            (link.rx_ns, link.rx_if, link.rx_ip),
        ):
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", iface], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", iface, "up"], check=True)
        yield link
    finally:
        for ns in (link.tx_ns, link.rx_ns):
            run("ip", "netns", "del", ns)


@pytest.fixture
def clean_link(link: Link) -> Link:
    assert link.shape("clear", link.tx_if).returncode == 0
    return link


RECEIVER = """
import socket, sys, time
srv = socket.create_server((sys.argv[1], 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
received, first, last = 0, None, None
while chunk := conn.recv(1 << 16):
    last = time.perf_counter()
    first = first or last
    received += len(chunk)
print(received, last - first, flush=True)
"""

SENDER = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:
    s.sendall(bytes(int(sys.argv[3])))
"""


def goodput_mbit(link: Link, payload_bytes: int) -> float:
    """TCP payload rate measured at the receiver, first to last byte; the sender runs in tx_ns."""
    receiver = subprocess.Popen(
        ["ip", "netns", "exec", link.rx_ns, sys.executable, "-c", RECEIVER, link.rx_ip],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = receiver.stdout.readline().strip()
        sender = run(
            "ip",
            "netns",
            "exec",
            link.tx_ns,
            sys.executable,
            "-c",
            SENDER,
            link.rx_ip,
            port,
            str(payload_bytes),
        )
        assert sender.returncode == 0, sender.stderr
        out, _ = receiver.communicate(timeout=15)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    received, seconds = out.split()
    assert int(received) == payload_bytes
    return int(received) * 8 / float(seconds) / 1e6


@needs_root
@pytest.mark.parametrize("qdisc", ["tbf", "htb"])
def test_a_50mbit_rate_gives_50mbit_of_tcp_goodput(clean_link, qdisc):
    applied = clean_link.shape("apply", clean_link.tx_if, RATE="50mbit", RATE_QDISC=qdisc)
    assert applied.returncode == 0, applied.stderr
    assert f"qdisc {qdisc}" in clean_link.qdiscs()
    mbit = goodput_mbit(clean_link, PAYLOAD_BYTES)
    print(f"{qdisc}: {mbit:.1f} Mbit/s of goodput through a {SHAPED_MBIT:g} Mbit/s shaped veth")
    assert mbit == pytest.approx(SHAPED_MBIT, rel=0.10)


@needs_root
def test_reapplying_converges_on_the_last_request(clean_link):
    iface = clean_link.tx_if
    for qdisc, rate in (("tbf", "20mbit"), ("tbf", "30mbit"), ("htb", "40mbit"), ("htb", "45mbit")):
        proc = clean_link.shape("apply", iface, RATE=rate, RATE_QDISC=qdisc)
        assert proc.returncode == 0, proc.stderr
    classes = run("tc", "-n", clean_link.tx_ns, "class", "show", "dev", iface).stdout
    assert clean_link.qdiscs().startswith("qdisc htb 1: root")
    assert "rate 45Mbit ceil 45Mbit" in classes and "40Mbit" not in classes

    proc = clean_link.shape("apply", iface, RATE="30mbit", RATE_QDISC="tbf")
    assert proc.returncode == 0, proc.stderr
    qdiscs = clean_link.qdiscs()
    assert "qdisc tbf" in qdiscs and "rate 30Mbit" in qdiscs and "htb" not in qdiscs

    assert clean_link.shape("clear", iface).returncode == 0
    assert clean_link.shape("clear", iface).returncode == 0  # clearing twice is fine
    assert "tbf" not in clean_link.qdiscs()


@needs_root
def test_a_rate_without_a_unit_is_refused_before_tc_runs(clean_link):
    proc = clean_link.shape("apply", clean_link.tx_if, RATE="50")
    assert proc.returncode == 2
    assert "RATE='50' is not a tc rate" in proc.stderr
    assert "tbf" not in clean_link.qdiscs()


@needs_root
def test_profile_values_are_applied(clean_link, tmp_path):
    profile = tmp_path / "site.env"
    profile.write_text("# a site\nPOWERTRIP_SITE_ID=eu-west\nRATE=25mbit\nDELAY=0ms\n")
    proc = clean_link.shape("apply", clean_link.tx_if, "--profile", str(profile))
    assert proc.returncode == 0, proc.stderr
    assert "rate 25Mbit" in clean_link.qdiscs()


@needs_root
@pytest.mark.skipif(NETEM, reason="this kernel has netem; the missing-netem path cannot occur")
def test_delay_without_netem_fails_naming_the_relay_and_leaves_the_link_as_it_was(clean_link):
    assert clean_link.shape("apply", clean_link.tx_if, RATE="30mbit").returncode == 0
    before = clean_link.qdiscs()

    proc = clean_link.shape("apply", clean_link.tx_if, RATE="50mbit", DELAY="40ms")

    assert proc.returncode == 3
    assert "netem is unavailable" in proc.stderr
    assert "DELAY=40ms" in proc.stderr
    assert "powertrip.services.netem.delay_relay" in proc.stderr
    assert clean_link.qdiscs() == before


@needs_root
@pytest.mark.skipif(NETEM, reason="this kernel has netem; the missing-netem path cannot occur")
def test_without_unshare_netem_is_probed_on_the_interface_itself(clean_link, tmp_path):
    # A container with only CAP_NET_ADMIN cannot unshare; stand in for that with a failing one.
    fake = tmp_path / "unshare"
    fake.write_text(
        "#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    assert clean_link.shape("apply", clean_link.tx_if, RATE="30mbit").returncode == 0
    before = clean_link.qdiscs()

    proc = clean_link.shape(
        "apply", clean_link.tx_if, DELAY="40ms", PATH=f"{tmp_path}:{os.environ['PATH']}"
    )

    assert proc.returncode == 3
    assert "netem is unavailable" in proc.stderr
    assert clean_link.qdiscs() == before


@needs_root
@pytest.mark.skipif(NETEM, reason="this kernel has netem; the missing-netem path cannot occur")
def test_allow_no_netem_applies_the_rate_and_says_loudly_what_it_skipped(clean_link):
    proc = clean_link.shape(
        "apply", clean_link.tx_if, "--allow-no-netem", RATE="50mbit", DELAY="40ms", LOSS="1%"
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: netem is unavailable" in proc.stderr
    assert "SKIPPED DELAY=40ms LOSS=1%" in proc.stderr
    assert "rate 50Mbit" in clean_link.qdiscs()


@needs_root
@pytest.mark.skipif(not NETEM, reason="this kernel has no netem (sch_netem)")
def test_with_netem_delay_sits_under_the_rate_class(clean_link):
    proc = clean_link.shape("apply", clean_link.tx_if, RATE="50mbit", DELAY="40ms", JITTER="5ms")
    assert proc.returncode == 0, proc.stderr
    qdiscs = clean_link.qdiscs()
    assert "qdisc htb 1: root" in qdiscs
    assert "qdisc netem 10: parent 1:10" in qdiscs
    assert re.search(r"delay 40ms\s+5ms", qdiscs), qdiscs


# ------------------------------------------------------------------- topology (root)


def netns_names() -> set[str]:
    return {line.split()[0] for line in run("ip", "netns", "list").stdout.splitlines() if line}


def link_names() -> set[str]:
    out = run("ip", "-o", "link", "show").stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


class Topology:
    def __init__(self, prefix: str, state_dir: Path) -> None:
        self.prefix = prefix
        self.state_dir = state_dir

    def __call__(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        common = ("--prefix", self.prefix, "--state-dir", self.state_dir)
        return run(TOPOLOGY, *args, *common, env={"PYTHON": sys.executable}, timeout=60)

    def ours(self, names: set[str]) -> set[str]:
        """Names this topology could have made; other agents share the host's namespace list."""
        return {n for n in names if n.startswith(self.prefix)}


_TOPOLOGY_IDS = itertools.count()


@pytest.fixture
def topology(tmp_path) -> Iterator[Topology]:
    if not NETNS:
        pytest.skip("needs root and a working `ip netns`")
    # Unique per process and per test, and short enough for veth names (IFNAMSIZ).
    topo = Topology(f"t{PID}{'abcdefghijklmnopqrstuvwxyz'[next(_TOPOLOGY_IDS) % 26]}", tmp_path)
    yield topo
    topo("down")
    for ns in topo.ours(netns_names()):  # leftovers of a failed test; all carry our prefix
        run("ip", "netns", "del", ns)


SITES = "# name rate delay\neu-west\t50mbit\t32ms\nap-south,20mbit,66ms\n"
UP_FLAGS = () if NETEM else ("--allow-no-netem",)
# The site's kernel answering with a refusal proves the hub reaches the site over its link.
REACH = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=3)
except ConnectionRefusedError:
    print("reached")
"""


def qdiscs(ns: str, iface: str) -> str:
    return run("tc", "-n", ns, "qdisc", "show", "dev", iface).stdout


@needs_root
def test_topology_up_builds_a_shaped_star_and_down_removes_exactly_it(topology, tmp_path):
    profile = tmp_path / "sites.tsv"
    profile.write_text(SITES)
    p = topology.prefix
    netns_before, links_before = netns_names(), link_names()

    up = topology("up", "--profile", profile, *UP_FLAGS)

    assert up.returncode == 0, up.stderr
    assert {f"{p}-hub", f"{p}-site-0", f"{p}-site-1"} <= netns_names()
    assert topology.ours(link_names()) == set(), "links must live only inside the namespaces"
    # Both directions of each link are shaped: the hub's end (download), the site's (upload).
    assert "rate 50Mbit" in qdiscs(f"{p}-hub", f"{p}h0")
    assert "rate 50Mbit" in qdiscs(f"{p}-site-0", f"{p}s0")
    assert "rate 20Mbit" in qdiscs(f"{p}-hub", f"{p}h1")
    assert "rate 20Mbit" in qdiscs(f"{p}-site-1", f"{p}s1")
    reach = run("ip", "netns", "exec", f"{p}-hub", sys.executable, "-c", REACH, "10.77.0.6")
    assert reach.stdout.strip() == "reached", reach.stderr
    status = topology("status").stdout
    assert "ap-south" in status and "10.77.0.6" in status and "10.77.0.5" in status
    if not NETEM:
        assert "SKIPPED DELAY=32ms" in up.stderr
        assert "66ms (NOT applied: no netem" in status

    down = topology("down")

    assert down.returncode == 0, down.stderr
    assert topology.ours(netns_names()) == topology.ours(netns_before) == set()
    assert topology.ours(link_names()) == topology.ours(links_before) == set()
    assert not (tmp_path / f"{p}.topology").exists()


TC_UNITS = {"bit": 1, "Kbit": 1e3, "Mbit": 1e6, "Gbit": 1e9}


def tc_rate_bps(qdisc_show: str) -> float:
    """The rate of the first shaped qdisc, e.g. "... rate 28004Kbit burst ..." -> 28.004e6."""
    match = re.search(r"\brate (\d+(?:\.\d+)?)(bit|Kbit|Mbit|Gbit)\b", qdisc_show)
    assert match, qdisc_show
    return float(match[1]) * TC_UNITS[match[2]]


@needs_root
def test_topology_from_the_site_model_shapes_each_link_to_its_modelled_rate(topology):
    model = ("--sites", "2", "--seed", "0", "--rate-scale", "0.01")
    rows = run(sys.executable, "-m", "powertrip.services.netem.topology_profile", *model).stdout

    up = topology("up", *model, *UP_FLAGS)

    assert up.returncode == 0, up.stderr
    sites = [line.split("\t") for line in rows.splitlines() if not line.startswith("#")]
    assert len(sites) == 2
    p = topology.prefix
    for i, (name, rate, delay) in enumerate(sites):
        assert re.search(rf"{name}\s+{p}-site-{i}\s.*\s{rate}\s+{delay}", up.stdout), up.stdout
        mbit = float(rate.removesuffix("mbit"))
        assert tc_rate_bps(qdiscs(f"{p}-hub", f"{p}h{i}")) == pytest.approx(mbit * 1e6, rel=1e-3)
        assert tc_rate_bps(qdiscs(f"{p}-site-{i}", f"{p}s{i}")) == pytest.approx(
            mbit * 1e6, rel=1e-3
        )


@needs_root
@pytest.mark.skipif(NETEM, reason="this kernel has netem; the missing-netem path cannot occur")
def test_topology_up_without_netem_fails_and_leaves_nothing_behind(topology, tmp_path):
    profile = tmp_path / "sites.tsv"
    profile.write_text(SITES)

    up = topology("up", "--profile", profile)

    assert up.returncode == 3
    assert "netem is unavailable" in up.stderr and "removing what it created" in up.stderr
    assert topology.ours(netns_names()) == set()
    assert not (tmp_path / f"{topology.prefix}.topology").exists()


@needs_root
def test_topology_never_adopts_or_deletes_a_namespace_it_did_not_create(topology, tmp_path):
    profile = tmp_path / "sites.tsv"
    profile.write_text(SITES)
    foreign = f"{topology.prefix}-site-1"
    run("ip", "netns", "add", foreign)

    up = topology("up", "--profile", profile, *UP_FLAGS)
    down = topology("down")

    assert up.returncode != 0
    assert f"cannot create namespace '{foreign}'" in up.stderr
    assert down.returncode == 0
    assert topology.ours(netns_names()) == {foreign}
