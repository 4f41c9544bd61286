"""Peak-memory probes shared by the memory benchmarks (Linux /proc)."""

from __future__ import annotations

import resource


def status_kib(field: str) -> int:
    """A KiB field of /proc/self/status, e.g. VmRSS or VmHWM."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False when not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def kib(field: str, exact: bool) -> int:
    """``field`` from /proc/self/status, or ru_maxrss (KiB on Linux) when the reset failed."""
    return status_kib(field) if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
