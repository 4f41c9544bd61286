"""Checkpoints after every round: the global model (npz, never pickle) plus a JSON manifest.

Writes are atomic (temporary file, fsync, ``os.replace``), and the manifest carries the model's
SHA-256, so a crash mid-write or a corrupted file is detected at load and the previous good
checkpoint is used instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

logger = logging.getLogger(__name__)
KEEP = 2  # the newest and one fallback


@dataclass(frozen=True)
class Checkpoint:
    round: int
    params: dict[str, NDArray]
    state: dict[str, Any]  # clock, accuracy, records...


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save(directory: Path, round_index: int, params: Mapping[str, NDArray], state: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    model = directory / f"round-{round_index:06d}.npz"
    _write_atomic(model, lambda f: np.savez(f, **params))
    manifest = {"round": round_index, "model": model.name, "sha256": _sha256(model), **state}
    _write_atomic(
        directory / f"round-{round_index:06d}.json",
        lambda f: f.write(json.dumps(manifest, indent=1).encode()),
    )
    for old in sorted(directory.glob("round-*.json"))[:-KEEP]:
        old.unlink(missing_ok=True)
        old.with_suffix(".npz").unlink(missing_ok=True)
    return model


def _load(manifest_path: Path) -> Checkpoint | None:
    try:
        manifest = json.loads(manifest_path.read_text())
        model = manifest_path.parent / manifest["model"]
        if _sha256(model) != manifest["sha256"]:
            raise ValueError("SHA-256 mismatch")
        with np.load(model, allow_pickle=False) as z:
            params = {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError) as exc:
        logger.warning("skipping checkpoint %s: %s", manifest_path.name, exc)
        return None
    state = {k: v for k, v in manifest.items() if k not in ("round", "model", "sha256")}
    return Checkpoint(int(manifest["round"]), params, state)


def load_latest(directory: Path) -> Checkpoint | None:
    """The newest checkpoint that verifies; None when there is none."""
    for manifest_path in sorted(directory.glob("round-*.json"), reverse=True):
        ckpt = _load(manifest_path)
        if ckpt is not None:
            return ckpt
    return None


def load_round(directory: Path, round_index: int) -> Checkpoint | None:
    """One round's checkpoint if it is still kept and verifies (the fallback of the newest)."""
    path = directory / f"round-{round_index:06d}.json"
    return _load(path) if path.exists() else None
