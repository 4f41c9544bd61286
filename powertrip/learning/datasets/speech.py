"""Spoken-word datasets as log-mel spectrograms, one natural group per speaker: the PowerTrip
paper's keyword-spotting workload (a transformer on Speech Commands, §5.1, Table 2), split
one client per speaker as the paper does.

Two layouts, both read from a user path (no download):

* ``speech-commands``: ``<word>/<speaker>_nohash_<n>.wav`` (Warden 2017), 16 kHz. The test set
  is the official ``testing_list.txt``; clips the lists do not name are placed by the official
  ``which_set`` hash of the speaker id, which is what the lists were made from. Either way a
  speaker's clips are all train or all test (the official protocol: test speakers are unseen).
  The validation list is folded into training: nothing here selects models.
* ``fsdd``: Free Spoken Digit Dataset, ``recordings/<digit>_<speaker>_<index>.wav``, 8 kHz. Its
  official split: indices 0-4 of every (digit, speaker) are test, so the split is *per speaker*
  (FSDD has only 6 speakers: holding whole speakers out would leave 5 clients or fewer).

Every clip is mixed to mono, resampled, centre padded or cropped to ``clip_seconds``, then
turned into log-mel frames (a Hann-window STFT and ``librosa``'s reference mel filterbank). Features
are standardised per mel bin with the training set's statistics. ``x`` is [n, frames, n_mels]:
time frames are the tokens of the keyword transformer (``learning.kwt``).
"""

from __future__ import annotations

import hashlib
import re
import wave
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from powertrip.extras import require
from powertrip.learning.datasets.progress import counted, report
from powertrip.learning.datasets.record import Dataset, DatasetError
from powertrip.learning.device import tensor

__all__ = ["SPEECH_DATASETS", "load_speech", "log_mel", "read_wav", "which_set"]

SPEECH_DATASETS = ("speech-commands", "fsdd")
_NATIVE_RATE = {"speech-commands": 16_000, "fsdd": 8_000}
_FSDD_NAME = re.compile(r"(\d)_([A-Za-z0-9]+)_(\d+)\.wav")
_MAX_PER_CLASS = 2**27 - 1  # from the Speech Commands README's which_set()


def which_set(filename: str, validation_pct: float = 10.0, testing_pct: float = 10.0) -> str:
    """The official Speech Commands split of a clip: a hash of the speaker id (the name up to
    ``_nohash_``), so a speaker's clips always land in the same set."""
    speaker = re.sub(r"_nohash_.*$", "", Path(filename).name)
    digest = int(hashlib.sha1(speaker.encode()).hexdigest(), 16)
    pct = (digest % (_MAX_PER_CLASS + 1)) * (100.0 / _MAX_PER_CLASS)
    if pct < validation_pct:
        return "validation"
    return "testing" if pct < validation_pct + testing_pct else "training"


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """(mono float32 samples in [-1, 1], sample rate) of a PCM WAV, read with ``wave``."""
    try:
        with wave.open(str(path), "rb") as fh:
            width, channels, rate = fh.getsampwidth(), fh.getnchannels(), fh.getframerate()
            raw = fh.readframes(fh.getnframes())
    except (wave.Error, EOFError, OSError) as exc:
        raise DatasetError(f"{path}: not a readable PCM WAV file ({exc})") from exc
    if width not in (1, 2, 4):
        raise DatasetError(f"{path}: {8 * width}-bit samples are not supported (8, 16, 32)")
    if len(raw) < width * channels:
        raise DatasetError(f"{path}: WAV file has no audio frames")
    if len(raw) % (width * channels):
        raise DatasetError(f"{path}: truncated WAV data ({len(raw)} bytes)")
    if width == 1:  # 8-bit WAV is unsigned
        samples = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    else:
        dtype = np.int16 if width == 2 else np.int32
        samples = np.frombuffer(raw, dtype).astype(np.float32) / float(np.iinfo(dtype).max + 1)
    return samples.reshape(-1, channels).mean(axis=1), rate


def _fit(samples: np.ndarray, rate: int, target_rate: int, length: int) -> np.ndarray:
    """Resample to ``target_rate``, then centre pad with zeros or centre crop to ``length``."""
    if rate != target_rate:
        # soxr's high-quality resampler, which librosa.resample calls by default; called
        # directly because librosa's wrapper JIT-compiles for tens of seconds on first use.
        # The output is trimmed or zero-padded to ceil(n * ratio) samples, as librosa's ``fix``.
        soxr = require("soxr", "speech", "resampling speech clips")
        want = int(np.ceil(len(samples) * target_rate / rate))
        samples = soxr.resample(samples, rate, target_rate, quality="soxr_hq")[:want]
        samples = np.pad(samples, (0, want - len(samples))).astype(np.float32, copy=False)
    if len(samples) >= length:
        start = (len(samples) - length) // 2
        return samples[start : start + length]
    out = np.zeros(length, dtype=np.float32)
    start = (length - len(samples)) // 2
    out[start : start + len(samples)] = samples
    return out


def log_mel(
    clips: np.ndarray,
    sample_rate: int,
    n_mels: int = 40,
    win_ms: float = 30.0,
    hop_ms: float = 10.0,
) -> np.ndarray:
    """[n, samples] -> [n, frames, n_mels] natural-log mel power (KWT's 40 mels, 30/10 ms).

    Centred frames (zero padded by half an FFT), a Hann window of ``win_ms`` zero padded to the
    next power of two, then ``librosa.filters.mel`` (Slaney filterbank, as librosa's own
    ``melspectrogram``; its STFT path costs seconds of imports, this numpy one does not)."""
    # ~1.5 s import: only when loading audio
    mel_filterbank = require("librosa.filters", "speech", "the speech workloads' features").mel

    win, hop = round(sample_rate * win_ms / 1000), round(sample_rate * hop_ms / 1000)
    n_fft = 1 << (win - 1).bit_length()  # next power of two >= the window
    window = np.zeros(n_fft, dtype=np.float32)
    offset = (n_fft - win) // 2
    window[offset : offset + win] = np.hanning(win + 1)[:-1]  # periodic Hann, as librosa's
    bank = mel_filterbank(sr=sample_rate, n_fft=n_fft, n_mels=n_mels).T
    out = []
    for start in range(0, len(clips), 256):  # bounds the [clips, frames, n_fft] working set
        report(start, len(clips), "log-mel features (clips)")
        padded = np.pad(clips[start : start + 256], ((0, 0), (n_fft // 2, n_fft // 2)))
        frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft, axis=1)[:, ::hop]
        power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2
        mel = power.reshape(-1, power.shape[-1]) @ bank  # 2-D: numpy's 3-D matmul is 50x slower
        out.append(np.log(mel + 1e-6).reshape(*power.shape[:2], -1))
    report(len(clips), len(clips), "log-mel features (clips)")
    return np.concatenate(out)


def _speech_commands_files(root: Path) -> list[tuple[Path, str, str, bool]]:
    """(file, word, speaker, is_test) for every clip of a Speech Commands folder."""
    lists = {}
    for name in ("testing_list.txt", "validation_list.txt"):
        listed = root / name
        lists[name] = set(listed.read_text().split()) if listed.is_file() else set()
    rows = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")):
        for wav in sorted(folder.glob("*.wav")):
            if "_nohash_" not in wav.name:
                raise DatasetError(f"{wav}: expected a name <speaker>_nohash_<n>.wav")
            rel = f"{folder.name}/{wav.name}"
            if rel in lists["testing_list.txt"]:
                test = True
            elif rel in lists["validation_list.txt"]:
                test = False
            else:
                test = which_set(wav.name) == "testing"
            rows.append((wav, folder.name, wav.name.split("_nohash_")[0], test))
    return rows


def _fsdd_files(root: Path) -> list[tuple[Path, str, str, bool]]:
    """(file, digit, speaker, is_test) for every FSDD recording (official split: index < 5)."""
    folder = root / "recordings" if (root / "recordings").is_dir() else root
    rows = []
    for wav in sorted(folder.glob("*.wav")):
        match = _FSDD_NAME.fullmatch(wav.name)
        if match is None:
            raise DatasetError(f"{wav}: expected a name <digit>_<speaker>_<index>.wav")
        digit, speaker, index = match.groups()
        rows.append((wav, digit, speaker, int(index) < 5))
    return rows


def load_speech(
    path: Path,
    name: str = "speech-commands",
    sample_rate: int | None = None,
    clip_seconds: float = 1.0,
    n_mels: int = 40,
    win_ms: float = 30.0,
    hop_ms: float = 10.0,
    seed: int = 0,
) -> Dataset:
    """Load ``name`` ("speech-commands" or "fsdd") from ``path`` as log-mel frames, with one
    natural group per speaker. ``sample_rate`` defaults to the dataset's own (16 / 8 kHz).
    The split is fixed by the dataset (see the module docstring), so ``seed`` is unused."""
    del seed  # the split is the dataset's own, deterministic by construction
    if name not in SPEECH_DATASETS:
        raise DatasetError(f"unknown speech dataset {name!r}; valid: {', '.join(SPEECH_DATASETS)}")
    path = Path(path)
    if not path.is_dir():
        raise DatasetError(f"{path}: {name} dataset directory not found")
    rows = _speech_commands_files(path) if name == "speech-commands" else _fsdd_files(path)
    if not rows:
        raise DatasetError(f"{path}: no .wav clips in the {name} layout")
    rate = sample_rate or _NATIVE_RATE[name]
    length = round(rate * clip_seconds)
    reading = counted(rows, f"{name}: reading clips")
    clips = np.stack([_fit(*read_wav(wav), rate, length) for wav, *_ in reading])
    feats = log_mel(clips, rate, n_mels=n_mels, win_ms=win_ms, hop_ms=hop_ms)
    return _speech_dataset(name, feats, rows)


def _speech_dataset(
    name: str, feats: np.ndarray, rows: Sequence[tuple[Path, str, str, bool]]
) -> Dataset:
    is_test = np.array([r[3] for r in rows])
    if is_test.all() or not is_test.any():
        raise DatasetError(f"{rows[0][0].parent.parent}: the split leaves train or test empty")
    classes = sorted({r[1] for r in rows})
    labels = np.array([classes.index(r[1]) for r in rows], dtype=np.int64)
    train, test = np.flatnonzero(~is_test), np.flatnonzero(is_test)
    speakers = sorted({rows[i][2] for i in train.tolist()})
    groups = np.array([speakers.index(rows[i][2]) for i in train.tolist()], dtype=np.int64)
    mean = feats[train].mean(axis=(0, 1))
    std = feats[train].std(axis=(0, 1)) + 1e-5
    feats = (feats - mean) / std
    return Dataset(
        name=name,
        task="audio",
        x_train=tensor(np.ascontiguousarray(feats[train])),
        y_train=tensor(labels[train]),
        x_test=tensor(np.ascontiguousarray(feats[test])),
        y_test=tensor(labels[test]),
        num_classes=len(classes),
        groups_train=groups,
        group_names=tuple(speakers),
    )
