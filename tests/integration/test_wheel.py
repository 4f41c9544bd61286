"""The wheel as a user installs it: built from this checkout, installed into a fresh venv, and run
from a directory that holds its own ``services`` package, which must not shadow ours.

The fresh venv gets only the wheel (``--no-deps``); torch, grpc and the rest come from the
development venv through a .pth line naming its site-packages. A .pth line adds a directory but
does not run the .pth files inside it, so the development venv's editable install of this
checkout stays invisible: every ``powertrip`` import (the services are ``powertrip.services``) must
come from the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

from powertrip.services.cli.service_process import READY

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SHADOW = 'raise ImportError("the working directory\'s services package was imported")\n'


@dataclass(frozen=True)
class Installed:
    bin: Path  # the fresh venv's scripts
    site_packages: Path
    workdir: Path  # empty but for its own services/__init__.py
    env: dict[str, str]

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        exe = self.bin / argv[0]
        return subprocess.run(
            [str(exe), *argv[1:]],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def python(self, code: str) -> str:
        done = self.run("python", "-P", "-c", code)  # -P: not the cwd first on sys.path
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


def _netns_works() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    name = f"ptwheel{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ok


def namespaces() -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


def _check(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    _check([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp), str(REPO)])
    (wheel,) = tmp.glob("powertrip-*.whl")
    venv = tmp / "venv"
    _check([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _check(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            str(wheel),
        ]
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dev = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(site) / "_dev_venv_dependencies.pth").write_text("".join(f"{d}\n" for d in dev))
    workdir = tmp / "elsewhere"
    (workdir / "services").mkdir(parents=True)
    (workdir / "services" / "__init__.py").write_text(SHADOW)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env |= {"OMP_NUM_THREADS": "1", "POWERTRIP_CACHE_DIR": str(tmp / "cache")}
    return Installed(venv / "bin", Path(site), workdir, env)


def test_the_packages_are_imported_from_the_wheel_not_the_checkout(installed):
    files = installed.python(
        "import powertrip, powertrip.services, powertrip.services.cli.service_process as sp\n"
        "print(powertrip.__file__, powertrip.services.__file__, sp.service_executable('worker'),"
        " sep='\\n')"
    ).splitlines()
    assert all(Path(f).is_relative_to(installed.site_packages) for f in files[:2]), files
    assert files[2] == str(installed.bin / "powertrip-worker")


def test_the_wheel_installs_one_top_level_package_with_its_version(installed):
    ours = {p.name for p in installed.site_packages.iterdir() if not p.name.startswith("_")}
    assert {n for n in ours if not n.endswith((".dist-info", ".pth"))} == {"powertrip"}
    (info,) = (n for n in ours if n.endswith(".dist-info"))
    version = installed.python("import powertrip; print(powertrip.__version__)")
    assert info == f"powertrip-{version}.dist-info"


def test_another_services_package_on_the_path_does_not_shadow_the_cli(installed):
    """The reproduction: a directory holding its own ``services`` package put first on
    PYTHONPATH used to break every command (``No module named 'services.cli'``)."""
    env = {**installed.env, "PYTHONPATH": str(installed.workdir)}
    for command in ("powertrip", "powertrip-aggregator"):
        done = subprocess.run(
            [str(installed.bin / command), "--help"],
            cwd=installed.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "the working directory's services package was imported" not in done.stderr


@pytest.mark.parametrize(
    ("service", "variables"),
    [
        ("aggregator", ["POWERTRIP_PROFILER_ADDR", "POWERTRIP_TARGET_ACCURACY"]),
        ("profiler", ["POWERTRIP_NUM_SITES", "POWERTRIP_PROBE_INTERVAL_S"]),
        ("worker", ["POWERTRIP_AGGREGATOR_ADDR", "POWERTRIP_SITES"]),
    ],
)
def test_each_service_command_explains_its_environment_and_exits_0(installed, service, variables):
    done = installed.run(f"powertrip-{service}", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: powertrip-{service}")
    for name in [*variables, "POWERTRIP_GRPC_PORT", "POWERTRIP_METRICS_PORT"]:
        assert name in done.stdout
    assert not READY.search(done.stdout)  # answered without serving anything


def test_an_unknown_argument_is_refused_with_exit_2(installed):
    done = installed.run("powertrip-worker", "--port", "50051")
    assert done.returncode == 2
    assert "unrecognized arguments: --port 50051" in done.stderr


def test_the_installed_package_ships_its_link_shaping_scripts(installed):
    code = "from powertrip.services.netem.scripts import tc_scripts_dir\nprint(tc_scripts_dir())"
    found = Path(installed.python(code))
    assert found.is_relative_to(installed.site_packages)
    assert (found / "topology.sh").is_file() and (found / "shape.sh").is_file()


def test_powertrip_up_runs_from_a_directory_with_its_own_services_package(installed):
    done = installed.run(
        "powertrip",
        "up",
        "--workers",
        "2",
        "--sites",
        "4",
        "--samples",
        "1000",
        "--target",
        "0.99",
        "--max-rounds",
        "2",
        "--output",
        "out",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert (installed.workdir / "out" / "rounds.csv").read_text().count("\n") == 1 + 2


@pytest.mark.skipif(not _netns_works(), reason="needs root with ip netns and tc")
def test_powertrip_up_shapes_links_in_network_namespaces_from_anywhere(installed):
    profile = installed.workdir / "links.tsv"
    profile.write_text("worker-0 10mbit 1ms\nworker-1 40mbit 1ms\n")
    before = set(namespaces())
    done = installed.run(
        "powertrip",
        "up",
        "--workers",
        "2",
        "--sites",
        "4",
        "--clock",
        "wall",
        "--netns-profile",
        str(profile),  # mTLS: the certificates name the veth addresses
        "--policy",
        "select-all",
        "--samples",
        "1000",
        "--target",
        "0.99",
        "--max-rounds",
        "2",
        "--output",
        "out-netns",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert set(namespaces()) <= before  # the hub and worker namespaces are gone
