"""Atomic, durable file writes and file checksums, for the checkpoints.

A file is written under a temporary name and fsynced, then renamed over its final name, then the
directory is fsynced (the rename lives in the directory's inode): a crash at any point leaves
either the old file or the new one, never a mix, and a power loss cannot undo a rename that
returned.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

TMP = ".tmp"  # suffix of a file being written


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def canonical_sha256(body: Mapping[str, Any]) -> str:
    """SHA-256 of one text per JSON value: sorted keys, no whitespace (floats as ``repr``)."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def write_temp(path: Path, write: Callable[[Any], object]) -> Path:
    """``path``'s content, written and fsynced under a temporary name (removed on failure)."""
    tmp = path.with_name(path.name + TMP)
    try:
        with tmp.open("wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def commit_rename(tmp: Path, path: Path) -> None:
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def fsync_dir(directory: Path) -> None:
    """Make the renames in ``directory`` durable (a rename lives in the directory's inode)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
