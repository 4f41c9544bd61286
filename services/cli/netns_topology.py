"""The ``--netns-profile`` wiring: a hub namespace and one tc-shaped link per worker namespace.

Built and torn down by ``topology.sh`` from the tc-scripts that ship with the package
(``powertrip.services.netem.scripts``), so an installed ``powertrip up`` runs it from any directory.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from powertrip.services.cli.service_process import LaunchError
from powertrip.services.netem.scripts import tc_scripts_dir


def topology_script() -> Path:
    return tc_scripts_dir() / "topology.sh"


@dataclass(frozen=True)
class Topology:
    """What ``topology.sh up --mgmt`` built, read back from its state file."""

    prefix: str
    state_dir: Path
    hub: str  # namespace of the aggregator and profiler
    hub_mgmt_ip: str  # the hub's address on the management link from this namespace
    sites: tuple[tuple[str, str, str], ...]  # (namespace, site address, hub address) per link

    @classmethod
    def up(cls, profile: Path, state_dir: Path) -> Topology:
        prefix = f"pu{os.getpid() % 100_000}"
        subnet = f"10.{79 + os.getpid() // 250 % 100}.{os.getpid() % 250}"
        script = topology_script()
        cmd = ["bash", str(script), "up", "--profile", str(profile), "--allow-no-netem", "--mgmt"]
        cmd += ["--prefix", prefix, "--subnet", subnet, "--state-dir", str(state_dir)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise LaunchError(f"topology.sh up failed: {done.stderr.strip()}")
        sites = []
        for line in (state_dir / f"{prefix}.topology").read_text().splitlines():
            f = line.split()
            if f[0] == "site":  # site i name ns site_if site_ip hub_if hub_ip rate delay applied
                sites.append((f[3], f[5], f[7]))
        return cls(prefix, state_dir, f"{prefix}-hub", f"{subnet}.254", tuple(sites))

    def down(self) -> None:
        subprocess.run(
            [
                "bash",
                str(topology_script()),
                "down",
                "--prefix",
                self.prefix,
                "--state-dir",
                str(self.state_dir),
            ],
            capture_output=True,
        )
