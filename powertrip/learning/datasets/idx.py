"""MNIST and EMNIST from a directory of IDX files (plain or .gz) that the user provides: the
PowerTrip paper's image workload (EMNIST with a CNN, §5.1, Table 2)."""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from powertrip.learning.datasets.progress import counted
from powertrip.learning.datasets.record import Dataset, DatasetError, split_indices
from powertrip.learning.device import tensor

__all__ = ["IDX_IMAGES_MAGIC", "IDX_LABELS_MAGIC", "MAX_IDX_CLASSES", "load_idx"]

IDX_IMAGES_MAGIC = 0x0803  # unsigned byte, 3 dims
IDX_LABELS_MAGIC = 0x0801  # unsigned byte, 1 dim
MAX_IDX_CLASSES = 62  # EMNIST ByClass, the largest IDX label set we support
_IMAGES_TAG = "images-idx3-ubyte"
_LABELS_TAG = "labels-idx1-ubyte"


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise DatasetError(f"{path}: file not found") from exc
    except (OSError, EOFError, zlib.error) as exc:  # truncated or corrupt .gz, unreadable file
        raise DatasetError(f"{path}: cannot read ({exc})") from exc


def _read_idx(path: Path, magic: int) -> np.ndarray:
    """Read one IDX file, checking the magic number and that the payload matches the header."""
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise DatasetError(f"{path}: {len(raw)} bytes is too short for an IDX header")
    (found,) = struct.unpack(">I", raw[:4])
    if found != magic:
        raise DatasetError(f"{path}: bad magic number 0x{found:08x}, expected 0x{magic:08x}")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: truncated header ({len(raw)} of {header} bytes)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(dims, dtype=np.int64))
    payload = len(raw) - header
    if payload != expected:
        raise DatasetError(
            f"{path}: payload is {payload} bytes but header dims {dims} need {expected}"
            + (" (truncated file)" if payload < expected else "")
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _idx_pairs(directory: Path) -> dict[str, tuple[Path, Path]]:
    """Map each images file's prefix (e.g. 'train-', 'emnist-byclass-test-') to its pair."""
    pairs: dict[str, tuple[Path, Path]] = {}
    for images in sorted(directory.iterdir()):
        name = images.name
        if _IMAGES_TAG not in name or not (name.endswith(_IMAGES_TAG) or name.endswith(".gz")):
            continue
        prefix = name.split(_IMAGES_TAG)[0]
        candidates = [directory / f"{prefix}{_LABELS_TAG}{ext}" for ext in (".gz", "")]
        labels = next((c for c in candidates if c.is_file()), None)
        if labels is None:
            raise DatasetError(
                f"{images}: no matching labels file (looked for {candidates[0].name} "
                f"or {candidates[1].name})"
            )
        pairs[prefix] = (images, labels)
    return pairs


def _load_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    images = _read_idx(images_path, IDX_IMAGES_MAGIC)
    labels = _read_idx(labels_path, IDX_LABELS_MAGIC)
    if len(labels) != len(images):
        raise DatasetError(
            f"{labels_path}: {len(labels)} labels but {images_path.name} has {len(images)} images"
        )
    bad = np.flatnonzero(labels >= MAX_IDX_CLASSES)
    if bad.size:
        raise DatasetError(
            f"{labels_path}: label {labels[bad[0]]} at record {bad[0]} is out of range "
            f"0..{MAX_IDX_CLASSES - 1}"
        )
    return images, labels


def _to_image_tensor(images: np.ndarray) -> torch.Tensor:
    return tensor(images.astype(np.float32) / 255.0).unsqueeze(1)


def load_idx(
    path: Path, test_fraction: float = 0.2, seed: int = 0, variant: str | None = None
) -> Dataset:
    """Load MNIST/EMNIST from a directory of IDX files (`*-images-idx3-ubyte[.gz]` + labels).

    With both a train and a test pair (`train-`/`t10k-`, or EMNIST's `-train-`/`-test-`) they are
    used as given; with a single pair it is split randomly with `test_fraction`. `variant`
    (e.g. "byclass") picks one set when the directory holds several EMNIST splits.
    Images are scaled to [0, 1], shape [n, 1, H, W]; num_classes = max label + 1.
    EMNIST images are stored transposed; we keep them as stored (a CNN does not care).
    """
    path = Path(path)
    if not path.is_dir():
        raise DatasetError(f"{path}: IDX dataset directory not found")
    pairs = _idx_pairs(path)
    if variant is not None:
        pairs = {k: v for k, v in pairs.items() if variant in k}
    if not pairs:
        what = f" matching variant {variant!r}" if variant else ""
        raise DatasetError(f"{path}: no *-{_IMAGES_TAG}[.gz] files{what}")
    train = [k for k in pairs if "train" in k]
    test = [k for k in pairs if "t10k" in k or "test" in k]
    if len(pairs) == 2 and len(train) == 1 and len(test) == 1:
        sets = counted([pairs[train[0]], pairs[test[0]]], f"{path.name}: reading IDX files")
        (x_tr, y_tr), (x_te, y_te) = (_load_pair(*pair) for pair in sets)
    elif len(pairs) == 1:
        ((images_path, labels_path),) = pairs.values()
        images, labels = _load_pair(images_path, labels_path)
        tr, te = split_indices(len(labels), test_fraction, seed)
        x_tr, y_tr, x_te, y_te = images[tr], labels[tr], images[te], labels[te]
    else:
        raise DatasetError(
            f"{path}: cannot tell which IDX files to use, found sets {sorted(pairs)}; "
            "pass variant=... or use a directory with one train/test set"
        )
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise DatasetError(f"{path}: train images {x_tr.shape[1:]} vs test {x_te.shape[1:]}")
    num_classes = int(max(y_tr.max(initial=0), y_te.max(initial=0))) + 1
    return Dataset(
        name="emnist" if num_classes > 10 else "mnist",
        task="image",
        x_train=_to_image_tensor(x_tr),
        y_train=tensor(y_tr.astype(np.int64)),
        x_test=_to_image_tensor(x_te),
        y_test=tensor(y_te.astype(np.int64)),
        num_classes=num_classes,
        groups_train=None,
    )
