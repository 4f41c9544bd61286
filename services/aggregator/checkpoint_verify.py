"""Verifying a checkpoint's files before a byte of them is used: the manifest's shape, types and
own SHA-256, the model's SHA-256 and a pickle-free load. Each failure is a ``Rejected`` with a
bounded reason (the ``powertrip_checkpoint_rejected_total`` label) and one line naming the file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from powertrip.services.aggregator import metrics
from powertrip.services.aggregator.durable_files import canonical_sha256, sha256_file

#: 1: model hash only, state at the top level; 2: the journal in the state; 3: a reference to
#: the journal file (all three resumed by replaying the journal); 4: the run's identity and every
#: component's ``state_dict`` (policy, loop, ...), so a resume replays nothing
FORMAT = 4
LOADS = (FORMAT,)
#: the values of the ``reason`` label (bounded: one series each)
REASONS = (
    "unreadable",  # a file cannot be read (missing model, permissions)
    "malformed",  # not JSON, or not the expected keys and types
    "old-format",  # written by an older version (no self-checksum, or no run state)
    "manifest-checksum",  # the manifest's content does not match its own SHA-256
    "model-checksum",  # the npz does not match the SHA-256 in the manifest
    "model-format",  # the npz does not load without pickle
    "incompatible",  # verified, but refused by the run (arrays or a state do not fit)
    "other-run",  # verified, but written by a run of another configuration or seed
)
_NAME = re.compile(r"round-(\d{6,})\.json")
for _reason in REASONS:  # every series exported from the start, at 0
    metrics.CHECKPOINT_REJECTED.labels(_reason)


class Rejected(Exception):
    def __init__(self, reason: str, path: Path, detail: str) -> None:
        assert reason in REASONS, reason
        super().__init__(f"{path.name}: {detail}")
        self.reason, self.path, self.detail = reason, path, " ".join(detail.split())


def verified_manifest(path: Path) -> dict[str, Any]:
    """The verified manifest of ``path``, or ``Rejected``."""
    try:
        text = path.read_bytes().decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise Rejected("unreadable", path, str(exc)) from None
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise Rejected("malformed", path, f"not JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise Rejected("malformed", path, f"a JSON {type(manifest).__name__}, not an object")
    if "format" not in manifest and "model_sha256" not in manifest and "sha256" in manifest:
        raise Rejected("old-format", path, "written by an older version (no self-checksum)")
    types = {"format": int, "round": int, "model": str, "model_sha256": str, "state": dict}
    for key, kind in {**types, "sha256": str}.items():
        if key not in manifest:
            raise Rejected("malformed", path, f"no {key!r}")
        if not isinstance(manifest[key], kind) or isinstance(manifest[key], bool):
            raise Rejected("malformed", path, f"{key!r} is not a {kind.__name__}")
    if set(manifest) != {*types, "sha256"}:
        raise Rejected("malformed", path, f"unexpected keys {sorted(set(manifest) - {*types})}")
    if manifest["format"] in (2, 3):
        raise Rejected(
            "old-format",
            path,
            f"format {manifest['format']}, written by an older version whose resume replayed "
            "the round journal (it holds no policy state)",
        )
    if manifest["format"] not in LOADS:
        raise Rejected("malformed", path, f"unknown format {manifest['format']}")
    body = {k: manifest[k] for k in types}
    if canonical_sha256(body) != manifest["sha256"]:
        raise Rejected("manifest-checksum", path, "content does not match its SHA-256 (edited?)")
    match = _NAME.fullmatch(path.name)
    r = manifest["round"]
    if match is None or int(match[1]) != r or manifest["model"] != f"round-{r:06d}.npz":
        raise Rejected("malformed", path, f"round {r} / model {manifest['model']!r} mismatch")
    return manifest


def verified_params(path: Path, sha256: str) -> dict[str, NDArray]:
    """The model arrays of ``path`` if its SHA-256 is ``sha256`` and it loads without pickle,
    or ``Rejected``."""
    try:
        actual = sha256_file(path)
    except OSError as exc:
        raise Rejected("unreadable", path, str(exc)) from None
    if actual != sha256:
        raise Rejected("model-checksum", path, "SHA-256 does not match the manifest's")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as exc:  # zipfile, format and pickle errors alike: all mean "not a model"
        raise Rejected("model-format", path, f"not a pickle-free npz: {exc}") from None
