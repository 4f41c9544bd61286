"""Measuring helpers for the load benchmarks (``registration_load.py``): percentiles and
spreads, a service's memory and handler time, failure causes, and background CPU load."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil
    return ordered[int(rank) - 1]


def server_mean_s(metrics_url: str, method: str = "RegisterWorker") -> float:
    """Mean of ``grpc_server_handling_seconds`` for ``method`` (every call, the flood's too)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    total = {"_sum": 0.0, "_count": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            suffix = sample.name.removeprefix("grpc_server_handling_seconds")
            if suffix in total and sample.labels.get("grpc_method") == method:
                total[suffix] += sample.value
    return total["_sum"] / total["_count"] if total["_count"] else float("nan")


def failure_kind(exc: grpc.RpcError) -> str:
    """``CODE: details`` without what varies (addresses, ports, times)."""
    details = re.sub(r"ipv4:[\d.:]+|\d+", "#", exc.details() or "")
    return f"{exc.code().name}: {details.removeprefix('failed to connect to all addresses; ')}"


@contextmanager
def busy_cores(n: int) -> Iterator[None]:
    """``n`` spinning processes: the other tenants of a shared machine."""
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in spin:
            p.kill()
            p.wait()


def spread(values: list[float]) -> str:
    """min/median/max"""
    v = sorted(values)
    return f"{v[0]:.3g}/{v[len(v) // 2]:.3g}/{v[-1]:.3g}" if v else "-"
