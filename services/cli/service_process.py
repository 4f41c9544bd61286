"""One service as a child process: started through its console script, ready on its READY line.

Children run ``powertrip-<kind>`` from the environment that runs the launcher, never
``python -m services.<kind>``: that would put the working directory first on ``sys.path``, so a
directory with its own ``services/`` package would shadow this one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

READY = re.compile(r"READY service=(\w+) grpc=(\S+) metrics=(\d+)")


class LaunchError(RuntimeError):
    pass


def service_executable(kind: str) -> str:
    """The ``powertrip-<kind>`` console script beside this interpreter (the venv's bin), else the
    one on PATH."""
    name = f"powertrip-{kind}"
    beside = Path(sys.executable).parent / name  # not resolved: a venv's python is a symlink
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    if found := shutil.which(name):
        return found
    raise LaunchError(
        f"{name} not found next to {sys.executable} or on PATH; install this package "
        "(pip install -e . in a checkout, or the wheel) into the environment that runs powertrip"
    )


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    host: str = "127.0.0.1"  # where this namespace reaches the service
    kind: str = ""  # aggregator, profiler or worker: which console script runs it
    env: dict[str, str] = field(default_factory=dict)
    netns: str | None = None
    log_path: Path | None = None
    grpc_addr: str = ""
    metrics_port: int = 0
    _ready: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the READY line; LaunchError (with the log's last lines) if the process
        exits or stays silent for ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while not self._ready.wait(0.1):
            if self.process.poll() is not None or time.monotonic() > end:
                log = self.log_path.read_text() if self.log_path else ""
                tail = log.strip().splitlines()[-3:]
                why = "exited" if self.process.poll() is not None else "did not become ready"
                raise LaunchError(f"{self.name} {why}; last log lines: {' | '.join(tail)}")

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            m = READY.search(line)
            if m and not self._ready.is_set():
                port = m.group(2).rsplit(":", 1)[1]
                self.grpc_addr, self.metrics_port = f"{self.host}:{port}", int(m.group(3))
                self._ready.set()


def start_service(
    name: str,
    kind: str,
    env: dict[str, str],
    log_dir: Path,
    netns: str | None = None,
    host: str = "127.0.0.1",
) -> Service:
    """Start ``powertrip-<kind>`` (inside ``netns`` if given) with stderr appended to
    ``log_dir/<name>.log``; the caller waits with ``Service.wait_ready``."""
    command = service_executable(kind)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    in_ns = ["ip", "netns", "exec", netns] if netns else []  # exec: the PID is the service's
    with log_path.open("a") as log:  # a restart appends
        proc = subprocess.Popen(
            [*in_ns, command],
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the launcher only
        )
    service = Service(name, proc, host=host, kind=kind, env=env, netns=netns, log_path=log_path)
    threading.Thread(target=service._read_stdout, daemon=True).start()
    return service
