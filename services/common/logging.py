"""One log format for every service: single-line key=value, with the service name."""

from __future__ import annotations

import logging
import sys


def configure(service: str, level: str = "INFO") -> None:
    fmt = f"ts=%(asctime)s level=%(levelname)s service={service} logger=%(name)s msg=%(message)s"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    try:
        root.setLevel(level.upper())
    except ValueError:
        root.setLevel(logging.INFO)
        root.warning("unknown log level %r, using INFO", level)
