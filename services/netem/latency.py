"""Which mechanism emulates link latency on this host, said out loud.

Kernel netem (tc-scripts/shape.sh DELAY=...) where the kernel has ``sch_netem``; otherwise the
application-level relay (services/netem/delay_relay.py), which logs its own WARNING for every
delay it adds. Services call ``log_latency_path`` at start so an operator reading the profiler's
log knows that RTTs measured through an emulated link came from the relay, not from the kernel.
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess

NETEM_PROBE = (
    "unshare",
    "--net",
    "tc",
    "qdisc",
    "add",
    "dev",
    "lo",
    "root",
    "netem",
    "delay",
    "1ms",
)


@functools.cache
def netem_available() -> bool | None:
    """True/False from adding netem to ``lo`` in a throwaway network namespace (the check
    tc-scripts/shape.sh makes); None when that check cannot run here (no unshare/tc, or no
    CAP_SYS_ADMIN), i.e. unknown."""
    if shutil.which("unshare") is None or shutil.which("tc") is None:
        return None
    try:
        proc = subprocess.run(NETEM_PROBE, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode == 0:
        return True
    if "unknown" in proc.stderr.lower() or "no such file" in proc.stderr.lower():
        return False  # "Specified qdisc kind is unknown": the kernel has no sch_netem
    return None  # e.g. unshare: Operation not permitted


def latency_path_message(netem: bool | None) -> str:
    if netem:
        return "latency path: kernel netem is available; tc-scripts/shape.sh DELAY=... applies it"
    why = "this kernel has no netem" if netem is False else "netem cannot be checked here"
    return (
        f"latency path: {why}; an emulated delay can only come from the application-level relay "
        "(python -m powertrip.services.netem.delay_relay), which logs each delay it adds: "
        "RTTs measured through it include the relay's delay, not a kernel qdisc's"
    )


def log_latency_path(logger: logging.Logger) -> bool | None:
    netem = netem_available()
    logger.log(logging.INFO if netem else logging.WARNING, latency_path_message(netem))
    return netem
