"""``powertrip flower run APP``: run a Flower app on a local simulation SuperLink that the command
starts and always stops, and exit with the run's own outcome.

Why not a plain ``flwr run .`` (Flower 1.41): its local SuperLink installs the app's
dependencies for every run (``uv sync``; powertrip is on no package index, so the run fails with
Flower's exit code 608), ``flwr run --stream`` exits 0 although the run failed (the failure is
only in the run's status, ``flwr ls``), and the SuperLink it starts stays running, detached, on
ports 39091/39093. This command starts ``flower-superlink --simulation
--disable-runtime-dependency-installation`` on a free port with a private Flower home (nothing is
written to ~/.flwr), runs ``flwr run APP --stream`` against it, reads the run's final status with
``flwr ls`` and stops the SuperLink and every process it started, whatever happened.

It imports no Flower: the Flower programs run as subprocesses, so ``powertrip --help`` stays
light and a base install without the ``flower`` extra gets a one-line error instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import click

CONNECTION = "powertrip-local"  # the SuperLink connection's name in the private Flower home
STARTUP_TIMEOUT_S = 120.0  # a loaded two-core machine takes 5-20 s to import Flower and answer
FINISH_WAIT_S = 120.0  # after the log stream ends, how long the run may take to read finished
STOP_WAIT_S = 20.0  # SIGTERM -> SIGKILL grace for the SuperLink and what it started
KILLED_WAIT_S = 10.0  # how long a SIGKILLed process may take to be gone (a loaded machine)
COMPLETED = "finished:completed"


class FlowerRunError(Exception):
    """The Flower run could not be started or did not complete; the message says why."""


@dataclass(frozen=True)
class RunStatus:
    """One run as ``flwr ls --format json`` reports it."""

    run_id: str
    status: str  # pending | starting | running | finished:completed|failed|stopped
    details: str


def flower_program(name: str) -> str:
    """The Flower console script ``name`` of this Python environment (beside the interpreter,
    where pip puts it even when the environment is not activated), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise FlowerRunError(
            f"{name} not found beside {sys.executable} or on PATH: "
            "pip install 'powertrip[flower]' into this environment"
        )
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flower_env(home: Path) -> dict[str, str]:
    """The environment of every Flower process: the private home, and this environment's
    scripts first on PATH (the SuperLink starts ``flower-superexec`` and ``flwr-simulation`` by
    name)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return os.environ | {"FLWR_HOME": str(home), "PATH": path, "FLWR_DISABLE_UPDATE_CHECK": "1"}


def write_connection(home: Path, port: int) -> None:
    """The private home's config.toml: one connection, the SuperLink this command starts."""
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every running process, from /proc (empty where there
    is none: the process-group kill is then all the clean-up there is)."""
    table: dict[int, tuple[int, str]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return table
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        if fields[0] == "Z":
            continue  # exited, not yet reaped
        table[int(entry.name)] = (int(fields[1]), fields[19])
    return table


def descendants(pid: int) -> dict[int, str]:
    """The processes below ``pid`` (pid -> start time): the SuperLink starts its SuperExec and
    the simulation in sessions of their own, and Ray its daemons, so its process group alone
    does not hold them all."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if child not in found:
            found[child] = table[child][1]
            todo.extend(children.get(child, []))
    return found


def _alive(pids: dict[int, str]) -> dict[int, str]:
    """Those of ``pids`` still running as the same process (a reused pid is not ours)."""
    table = _proc_table()
    return {p: t for p, t in pids.items() if p in table and table[p][1] == t}


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for p in pids:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def stop_superlink(link: subprocess.Popen[bytes], grace_s: float = STOP_WAIT_S) -> None:
    """SIGTERM the SuperLink (it stops its SuperExec) and its process group, then whatever it
    started that is still running; SIGKILL what outlives the grace period."""
    started = descendants(link.pid)
    with suppress(ProcessLookupError):
        os.killpg(link.pid, signal.SIGTERM)  # start_new_session: its pgid is its pid
    try:
        link.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(link.pid, signal.SIGKILL)
        link.wait()
    left = _alive(started)
    _signal_all(list(left), signal.SIGTERM)
    left = _wait_gone(left, grace_s)
    _signal_all(list(left), signal.SIGKILL)
    _wait_gone(left, KILLED_WAIT_S)  # a SIGKILL lands asynchronously: return once they are gone


def _wait_gone(pids: dict[int, str], timeout_s: float) -> dict[int, str]:
    """Those of ``pids`` still running after up to ``timeout_s``."""
    left = _alive(pids)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _alive(left)
    return left


def wait_healthy(port: int, link: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    """Wait for the SuperLink's /health; fail at once if it exited, naming its log's tail."""
    import urllib.request  # here, not at the top: ``powertrip --help`` need not load http

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if link.poll() is not None:
            raise FlowerRunError(
                f"flower-superlink exited with code {link.returncode} before it answered on "
                f"port {port}; its log: {_tail(log)}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise FlowerRunError(
        f"flower-superlink did not answer on 127.0.0.1:{port} within {timeout_s:.0f} s; "
        f"its log: {_tail(log)}"
    )


def _tail(log: Path) -> str:
    """What the log says went wrong, on one line: its last ERROR line, else its last line."""
    try:
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    except OSError:
        return f"{log} unreadable"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "ERROR" in line]
    return (errors or lines or ["(empty)"])[-1]


@contextmanager
def local_superlink(
    home: Path, port: int, log: Path, startup_timeout_s: float = STARTUP_TIMEOUT_S
) -> Iterator[subprocess.Popen[bytes]]:
    """A simulation SuperLink on 127.0.0.1:``port`` that installs no app dependencies (the run
    uses this environment), stopped with everything it started when the block ends, however it
    ends."""
    command = [
        flower_program("flower-superlink"),
        "--insecure",
        "--simulation",
        "--isolation",
        "subprocess",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-runtime-dependency-installation",
    ]  # its console output is its whole log (a --log-file would hold the same lines again)
    with open(log, "ab") as out:
        link = subprocess.Popen(
            command,
            env=flower_env(home),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, signalled as one
        )
    try:
        wait_healthy(port, link, log, startup_timeout_s)
        yield link
    finally:
        stop_superlink(link)
        click.echo("powertrip flower: the SuperLink is stopped", err=True)


def run_statuses(home: Path) -> list[RunStatus]:
    """Every run of the private SuperLink, from ``flwr ls --format json``."""
    proc = subprocess.run(
        [flower_program("flwr"), "ls", CONNECTION, "--format", "json"],
        env=flower_env(home),
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        runs = json.loads(proc.stdout)["runs"]
    except (ValueError, KeyError, TypeError):
        raise FlowerRunError(
            f"flwr ls exited with code {proc.returncode} without a run list: "
            f"{(proc.stderr or proc.stdout).strip()[-500:]}"
        ) from None
    return [RunStatus(str(r["run-id"]), str(r["status"]), str(r["status-details"])) for r in runs]


def final_status(home: Path, wait_s: float = FINISH_WAIT_S) -> RunStatus:
    """The one run of the private SuperLink once it has finished (its log stream can end a
    moment before its status says so)."""
    deadline = time.monotonic() + wait_s
    while True:
        runs = run_statuses(home)
        if len(runs) != 1:
            raise FlowerRunError(f"the SuperLink holds {len(runs)} runs, expected the one started")
        if runs[0].status.startswith("finished") or time.monotonic() > deadline:
            return runs[0]
        time.sleep(2.0)


def run_app(
    app: Path,
    run_config: Sequence[str] = (),
    federation_config: Sequence[str] = (),
    *,
    port: int = 0,
    superlink_log: Path | None = None,
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
) -> int:
    """Run the Flower app in ``app`` once on a fresh local simulation SuperLink: 0 when the run
    finished completed; otherwise a FlowerRunError saying why."""
    with tempfile.TemporaryDirectory(prefix="powertrip-flower-") as tmp:
        home = Path(tmp)
        port = port or free_port()
        write_connection(home, port)
        log = superlink_log.resolve() if superlink_log else home / "superlink.log"
        click.echo(f"powertrip flower: starting a local SuperLink on 127.0.0.1:{port}", err=True)
        with local_superlink(home, port, log, startup_timeout_s):
            command = [flower_program("flwr"), "run", str(app), CONNECTION, "--stream"]
            for value in run_config:
                command += ["--run-config", value]
            for value in federation_config:
                command += ["--federation-config", value]
            code = subprocess.run(command, env=flower_env(home), check=False).returncode
            if code != 0:
                raise FlowerRunError(f"flwr run exited with code {code}")
            run = final_status(home)
    if run.status != COMPLETED:
        raise FlowerRunError(f"Flower run {run.run_id} {run.status}: {run.details or 'no details'}")
    click.echo(f"powertrip flower: run {run.run_id} {run.status}", err=True)
    return 0


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM ends the command through its ``finally`` blocks, so the SuperLink is stopped."""
    raise SystemExit(128 + signum)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def flower() -> None:
    """Flower apps with PowerTrip's strategies (needs pip install 'powertrip[flower]')."""


@flower.command("run")
@click.argument(
    "app", type=click.Path(exists=True, file_okay=False, path_type=Path), default=Path(".")
)
@click.option(
    "--run-config",
    "-c",
    multiple=True,
    metavar="'K=V ...'",
    help="flwr run's --run-config: override the app's [tool.flwr.app.config] (TOML values).",
)
@click.option(
    "--federation-config",
    multiple=True,
    metavar="'K=V ...'",
    help="flwr run's --federation-config, e.g. 'num-supernodes=20 client-resources-num-cpus=1'.",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=0, help="SuperLink port (0: a free one)."
)
@click.option(
    "--superlink-log",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Keep the SuperLink's log here (default: removed with the run's Flower home).",
)
def run_command(
    app: Path,
    run_config: tuple[str, ...],
    federation_config: tuple[str, ...],
    port: int,
    superlink_log: Path | None,
) -> None:
    """Run the Flower app in APP (default: .) on a local simulation SuperLink, streaming its
    log, and exit non-zero unless the run completed.

    The SuperLink runs with a private Flower home and without per-run dependency installation
    (the app runs in this environment), and is stopped with everything it started when the run
    ends, fails or is interrupted.
    """
    if not (app / "pyproject.toml").is_file():
        click.echo(f"error: {app}: no pyproject.toml, not a Flower app", err=True)
        sys.exit(2)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        code = run_app(
            app.resolve(), run_config, federation_config, port=port, superlink_log=superlink_log
        )
    except FlowerRunError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    sys.exit(code)


if __name__ == "__main__":
    flower()
