"""The cluster's identity names and the one rule for a worker or site id: plain Python, so a
configuration check or ``powertrip certs --help`` needs no gRPC (``identity`` uses them to
check callers)."""

from __future__ import annotations

import re

#: the service identities (certificate CNs) every cluster has besides its workers; the one place
#: that names them (``powertrip certs`` mints exactly these)
AGGREGATOR, PROFILER, OPERATOR = "aggregator", "profiler", "operator"
SERVICES = (AGGREGATOR, PROFILER, OPERATOR)

#: worker and site ids: 1-64 characters of letters, digits, '.', '_' and '-'. Wide enough for
#: hostnames ("powertrip-worker-3", pod names), "w0" and "site-007"; narrow enough that an id
#: is safe in a log line, a metric label, a file name and a certificate CN.
ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SHOWN = 40  # characters of a bad id quoted in an error message


def id_problem(value: str, what: str = "worker id") -> str | None:
    """Why ``value`` is not a valid id (a message naming it, truncated, repr'd), or None."""
    if ID_PATTERN.fullmatch(value):
        return None
    shown = repr(value[:_SHOWN]) + (f"... ({len(value)} chars)" if len(value) > _SHOWN else "")
    return f"bad {what} {shown}: use 1-64 characters of A-Z a-z 0-9 . _ -"


def validate_id(value: str, what: str = "worker id") -> str:
    """``value`` if it is a valid id, else ValueError (config and CLI callers)."""
    problem = id_problem(value, what)
    if problem:
        raise ValueError(problem)
    return value
