"""Dataset loaders for the worker and the emulator (pure: no grpc, no network).

Every loader returns the same `Dataset` record, so partitioning, models and the trainer never
care where the data came from:

* mnist1d: generated offline by the `mnist1d` package (the embedded default dataset, since the
  project may not ship or download real data) and cached as .npz.
* MNIST / EMNIST: IDX files (plain or .gz) from a directory the user provides.
* Shakespeare: LEAF-style next-character prediction, one natural group per speaking role.

Bad input raises `DatasetError` whose message names the file (and record/line where known):
a study that silently trains on half a file is worse than one that refuses to start.
"""

from __future__ import annotations

import gzip
import os
import random
import re
import struct
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "DATASET_NAMES",
    "LEAF_VOCAB",
    "Dataset",
    "DatasetError",
    "decode_chars",
    "encode_chars",
    "load_dataset",
    "load_idx",
    "load_mnist1d",
    "load_shakespeare",
]


class DatasetError(ValueError):
    """A dataset is missing or malformed; the message names the file (and where in it)."""


@dataclass(frozen=True, eq=False)  # eq=False: tensors have no truth value
class Dataset:
    """A train/test split plus the natural grouping the federated partitioner may use."""

    name: str  # "mnist1d", "mnist", "emnist", "shakespeare"
    task: str  # "image" or "next-char"
    x_train: torch.Tensor  # float32 [n, C, L] / [n, 1, H, W]; int64 [n, seq_len] for chars
    y_train: torch.Tensor  # int64 [n]
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    groups_train: np.ndarray | None  # natural group id per training sample, else None
    group_names: tuple[str, ...] = ()  # name per group id
    synthetic: bool = False  # True for generated data (mnist1d)

    @property
    def in_shape(self) -> tuple[int, ...]:
        """Shape of one input sample (what `models.build_model` needs)."""
        return tuple(self.x_train.shape[1:])


# --------------------------------------------------------------------------------------------
# shared helpers


def _check_fraction(test_fraction: float) -> None:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")


def _split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random train/test split of n samples; both sides get at least one sample."""
    _check_fraction(test_fraction)
    if n < 2:
        raise ValueError(f"need at least 2 samples to split into train and test, got {n}")
    n_test = min(max(1, round(n * test_fraction)), n - 1)
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


# --------------------------------------------------------------------------------------------
# mnist1d


def _default_cache_dir() -> Path:
    return Path(os.environ.get("POWERTRIP_CACHE_DIR", "~/.cache/powertrip")).expanduser()


def _generate_mnist1d(num_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Run the mnist1d generator without leaking its global-RNG reseeding into the caller."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = seed
    args.train_split = 1.0  # we split ourselves, so the cache is independent of test_fraction
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        data = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    x = np.concatenate([data["x"], data["x_test"]]).astype(np.float32)
    y = np.concatenate([data["y"], data["y_test"]]).astype(np.int64)
    return x, y


def load_mnist1d(
    num_samples: int = 20000,
    test_fraction: float = 0.2,
    seed: int = 0,
    cache_dir: Path | None = None,
) -> Dataset:
    """Generate (or load from cache) the synthetic MNIST-1D dataset.

    x has shape [n, 1, 40], standardised to zero mean and unit variance (the generator already
    does this over the whole set). The generator shuffles, so the last `test_fraction` of the
    samples is the test set, which reproduces mnist1d's own 80/20 split for the default.
    `num_samples` is rounded down to a multiple of 10 (equal samples per class).
    """
    _check_fraction(test_fraction)
    if num_samples < 20:
        raise ValueError(f"num_samples must be >= 20, got {num_samples}")
    cache_dir = _default_cache_dir() if cache_dir is None else Path(cache_dir)
    cache_file = cache_dir / f"mnist1d_n{num_samples}_seed{seed}_v1.npz"
    x = y = None
    if cache_file.is_file():
        try:
            with np.load(cache_file) as cached:
                x, y = cached["x"], cached["y"]
        except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error):
            x = y = None  # corrupt cache (e.g. an interrupted write elsewhere): regenerate
    if x is None or y is None:
        x, y = _generate_mnist1d(num_samples, seed)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f"{cache_file.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, x=x, y=y)
        os.replace(tmp, cache_file)  # atomic: parallel workers never read a half-written file
    n_test = min(max(1, round(len(y) * test_fraction)), len(y) - 1)
    x_t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).unsqueeze(1)
    y_t = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
    split = len(y) - n_test
    return Dataset(
        name="mnist1d",
        task="image",
        x_train=x_t[:split],
        y_train=y_t[:split],
        x_test=x_t[split:],
        y_test=y_t[split:],
        num_classes=10,
        groups_train=None,
        synthetic=True,
    )


# --------------------------------------------------------------------------------------------
# IDX (MNIST / EMNIST)

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
    return torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)


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
        x_tr, y_tr = _load_pair(*pairs[train[0]])
        x_te, y_te = _load_pair(*pairs[test[0]])
    elif len(pairs) == 1:
        ((images_path, labels_path),) = pairs.values()
        images, labels = _load_pair(images_path, labels_path)
        tr, te = _split_indices(len(labels), test_fraction, seed)
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
        y_train=torch.from_numpy(y_tr.astype(np.int64)),
        x_test=_to_image_tensor(x_te),
        y_test=torch.from_numpy(y_te.astype(np.int64)),
        num_classes=num_classes,
        groups_train=None,
    )


# --------------------------------------------------------------------------------------------
# Shakespeare (LEAF-style next-character prediction)

# LEAF's 80-character vocabulary; anything else maps to UNK_INDEX (so num_classes is 81).
LEAF_VOCAB = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
UNK_INDEX = len(LEAF_VOCAB)
VOCAB_SIZE = len(LEAF_VOCAB) + 1
_CHAR_TABLE = np.full(128, UNK_INDEX, dtype=np.int64)
_CHAR_TABLE[[ord(c) for c in LEAF_VOCAB]] = np.arange(len(LEAF_VOCAB))

_DIRECTION_RE = re.compile(r"\[[^\[\]]{0,600}\]")  # [Exit.], [Enter ...] spanning lines
_TAG_RE = re.compile(r"([A-Z0-9][A-Za-z0-9'&\- ]{0,38}?)\s*([.:]?)")
_ROMAN_RE = re.compile(r"[IVXLC]+")
_ACT_SCENE_RE = re.compile(
    r"(?i)(?:act|scene)\s+(?:[ivxlc\d]+|first|second|third|fourth|fifth|last)\b.*"
)
_SECTION_RE = re.compile(r"(?i)(?:prologue|epilogue|induction|the end|finis)\b.{0,60}")
_NOT_ROLES = {"ENTER", "EXIT", "EXEUNT", "FLOURISH", "PERSONS REPRESENTED", "DRAMATIS PERSONAE"}
_MINOR_WORDS = {"of", "and", "the", "de", "la", "le", "du", "in", "to"}


def encode_chars(text: str) -> np.ndarray:
    """Map text to LEAF vocabulary indices (int64); unknown characters become UNK_INDEX."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return np.where(codes < 128, _CHAR_TABLE[np.minimum(codes, 127)], UNK_INDEX)


def decode_chars(indices: Iterable[int]) -> str:
    """Inverse of `encode_chars` (UNK shows as U+FFFD), for debugging and tests."""
    return "".join(LEAF_VOCAB[i] if i < UNK_INDEX else "\ufffd" for i in map(int, indices))


def _speaker_tag(line: str) -> str | None:
    """Return the normalised role if `line` looks like a speaker tag ('Ber.', 'HAMLET', 'All:')."""
    m = _TAG_RE.fullmatch(line)
    if m is None:
        return None
    name, terminator = m.group(1).strip(), m.group(2)
    words = name.split()
    if not words or len(words) > 4:
        return None
    if terminator == "" and name != name.upper():  # bare tags only in upper case (THESEUS)
        return None
    if any(w[0].islower() and w not in _MINOR_WORDS for w in words):
        return None  # prose like "Another part of the forest."
    role = " ".join(words).upper()
    if _ROMAN_RE.fullmatch(role) or role in _NOT_ROLES or _ACT_SCENE_RE.fullmatch(line):
        return None
    return role


def _parse_roles(text: str) -> dict[str, list[str]]:
    """Split a speaker-tagged play text into {role: [speech, ...]}.

    A speaker tag is a short capitalised line after a blank line (or at the start), ending in
    '.', ':' or nothing (all caps). A role is accepted only if its tag occurs at least twice
    and is directly followed by speech at least once: that rejects one-off lines such as
    "Speak." and titles repeated above the first act. Stage directions in [...] are removed;
    act/scene headings (and prologue/epilogue headings standing alone) end the current speech,
    so scene locations are never attributed to a role; everything before the first heading
    (title, cast list) is front matter and skipped.
    """
    lines = _DIRECTION_RE.sub("", text.replace("\r\n", "\n")).split("\n")
    lines.append("")
    candidates: list[tuple[int, str]] = []
    headers: set[int] = set()
    counts: dict[str, int] = {}
    speaks: set[str] = set()
    prev_blank = True
    for i, line in enumerate(lines[:-1]):
        stripped = line.rstrip()
        if prev_blank and stripped and not stripped[0].isspace():
            next_blank = not lines[i + 1].strip()
            section = next_blank and _SECTION_RE.fullmatch(stripped)
            if section or _ACT_SCENE_RE.fullmatch(stripped):
                headers.add(i)
            elif (role := _speaker_tag(stripped)) is not None:
                candidates.append((i, role))
                counts[role] = counts.get(role, 0) + 1
                if not next_blank:
                    speaks.add(role)
        prev_blank = not stripped
    body = min(headers, default=-1)  # title and cast list come before the first heading
    tags = {i: r for i, r in candidates if i > body and counts[r] >= 2 and r in speaks}
    speeches: dict[str, list[str]] = {}
    current: str | None = None
    for i, line in enumerate(lines):
        if i in tags:
            current = tags[i]
        elif i in headers:
            current = None
        elif current is not None and line.strip():
            speeches.setdefault(current, []).append(line.strip())
    return speeches


def _read_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read ({exc})") from exc
    if not text.strip():
        raise DatasetError(f"{path}: file is empty")
    return text


def _role_texts(path: Path) -> dict[str, str]:
    """{group name: that role's whole text}. Lines are joined with spaces as LEAF does."""
    if path.is_dir():
        files = sorted(p for p in path.glob("*.txt") if p.is_file())
        if not files:
            raise DatasetError(f"{path}: no .txt files in directory")
        roles: dict[str, str] = {}
        for file in files:
            try:
                text = file.read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                raise DatasetError(f"{file}: cannot read ({exc})") from exc
            play = file.stem.removesuffix("_gut")
            for role, speech in _parse_roles(text).items():  # poems/sonnets yield nothing
                roles[f"{play}/{role}"] = " ".join(speech)
        if not roles:
            raise DatasetError(f"{path}: no speaker-tagged text found in any of {len(files)} files")
        return roles
    roles = {role: " ".join(speech) for role, speech in _parse_roles(_read_text(path)).items()}
    if not roles:
        raise DatasetError(f"{path}: no speaker-tagged text found (expected 'NAME:' or 'Abbr.')")
    return roles


def load_shakespeare(
    path: Path,
    seq_len: int = 80,
    max_samples: int | None = 100_000,
    min_samples_per_role: int = 20,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> Dataset:
    """LEAF-style Shakespeare: one group per (play, role) for a directory, per role for a file.

    Each position of a role's text gives a sample (seq_len chars -> next char). To bound
    memory, positions are taken every `stride` chars, with one stride for all roles chosen so
    the total is at most `max_samples` (None: every position; ~4 M samples for the full
    works). Roles left with fewer than `min_samples_per_role` samples are dropped. The test set
    is the last `test_fraction` of each role's samples (LEAF splits each role in time order).
    `seed` picks each role's stride phase.
    """
    _check_fraction(test_fraction)
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if min_samples_per_role < 2:
        raise ValueError("min_samples_per_role must be >= 2 (one train and one test sample)")
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: Shakespeare text file or directory not found")
    roles = _role_texts(path)
    names = sorted(roles)
    texts = [re.sub(r"\s+", " ", roles[name]).strip() for name in names]
    positions_per_role = np.array([max(len(t) - seq_len, 0) for t in texts], dtype=np.int64)
    total = int(positions_per_role.sum())
    stride = 1 if max_samples is None else max(1, -(-total // max(1, max_samples)))
    rng = np.random.default_rng(seed)
    phases = rng.integers(0, stride, size=len(names)) if stride > 1 else np.zeros(len(names), int)
    counts = np.maximum(positions_per_role - phases + stride - 1, 0) // stride
    keep = np.flatnonzero(counts >= min_samples_per_role)
    if keep.size == 0:
        raise DatasetError(
            f"{path}: no role has {min_samples_per_role} samples of {seq_len + 1} chars "
            f"(stride {stride}); lower min_samples_per_role or raise max_samples"
        )
    codes = encode_chars("".join(texts[k] for k in keep))
    windows = np.lib.stride_tricks.sliding_window_view(codes, seq_len)
    parts_tr, parts_te, groups = [], [], []
    offset = 0
    for group_id, k in enumerate(keep):
        starts = offset + phases[k] + stride * np.arange(counts[k])
        n_test = max(1, int(counts[k] * test_fraction))
        parts_tr.append(starts[:-n_test])
        parts_te.append(starts[-n_test:])
        groups.append(np.full(len(starts) - n_test, group_id, dtype=np.int64))
        offset += len(texts[k])
    train_starts, test_starts = np.concatenate(parts_tr), np.concatenate(parts_te)
    return Dataset(
        name="shakespeare",
        task="next-char",
        x_train=torch.from_numpy(np.ascontiguousarray(windows[train_starts])),
        y_train=torch.from_numpy(codes[train_starts + seq_len]),
        x_test=torch.from_numpy(np.ascontiguousarray(windows[test_starts])),
        y_test=torch.from_numpy(codes[test_starts + seq_len]),
        num_classes=VOCAB_SIZE,
        groups_train=np.concatenate(groups),
        group_names=tuple(names[k] for k in keep),
    )


# --------------------------------------------------------------------------------------------
# dispatch

DATASET_NAMES = ("mnist1d", "mnist", "emnist", "shakespeare")


def load_dataset(name: str, path: Path | None = None, **kwargs) -> Dataset:
    """Load a dataset by name; `path` is required for everything but the generated mnist1d."""
    if name not in DATASET_NAMES:
        raise DatasetError(f"unknown dataset {name!r}; valid names: {', '.join(DATASET_NAMES)}")
    if name == "mnist1d":
        return load_mnist1d(**kwargs)
    if path is None:
        raise DatasetError(f"dataset {name!r} needs a path to its files")
    if name == "shakespeare":
        return load_shakespeare(Path(path), **kwargs)
    return load_idx(Path(path), **kwargs)
