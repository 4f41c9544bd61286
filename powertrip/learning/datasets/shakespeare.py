"""LEAF-style Shakespeare: next-character prediction with one natural group per speaking role,
the PowerTrip paper's text workload (a two-layer LSTM, §5.1, Table 2)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from powertrip.learning.datasets.progress import counted
from powertrip.learning.datasets.record import Dataset, DatasetError, check_fraction
from powertrip.learning.device import tensor

__all__ = [
    "LEAF_VOCAB",
    "UNK_INDEX",
    "VOCAB_SIZE",
    "decode_chars",
    "encode_chars",
    "load_shakespeare",
]

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
        for file in counted(files, "shakespeare: parsing plays"):
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
    check_fraction(test_fraction)
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
        x_train=tensor(np.ascontiguousarray(windows[train_starts])),
        y_train=tensor(codes[train_starts + seq_len]),
        x_test=tensor(np.ascontiguousarray(windows[test_starts])),
        y_test=tensor(codes[test_starts + seq_len]),
        num_classes=VOCAB_SIZE,
        groups_train=np.concatenate(groups),
        group_names=tuple(names[k] for k in keep),
    )
