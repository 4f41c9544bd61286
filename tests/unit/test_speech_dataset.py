"""Speech loaders on the real Speech Commands sample and FSDD from ../shared/data: log-mel frames
of fixed shape, one natural group per speaker, the datasets' own splits; bad WAVs named."""

from __future__ import annotations

import shutil
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from powertrip.config.workloads import BUILTIN_WORKLOADS
from powertrip.learning.datasets import DatasetError, load_speech
from powertrip.learning.datasets.speech import log_mel, read_wav, which_set
from powertrip.learning.partition import partition

SPEECH = "datasets/speech_commands_v0.01_sample"
FSDD = "datasets/fsdd"


@pytest.fixture(scope="module")
def speech_commands(shared_data: Path):
    return load_speech(shared_data / SPEECH, "speech-commands")


@pytest.fixture(scope="module")
def fsdd(shared_data: Path):
    return load_speech(shared_data / FSDD, "fsdd")


def small_fsdd(shared_data: Path, root: Path) -> Path:
    """A copy of 20 of jackson's real recordings (test indices 0-4 and train ones) in root."""
    (root / "recordings").mkdir(parents=True)
    for wav in sorted((shared_data / FSDD / "recordings").glob("*_jackson_*.wav"))[:20]:
        shutil.copy(wav, root / "recordings" / wav.name)
    return root


def write_wav(path: Path, samples: np.ndarray, rate: int, width: int = 2) -> Path:
    with wave.open(str(path), "wb") as fh:
        fh.setnchannels(1)
        fh.setsampwidth(width)
        fh.setframerate(rate)
        fh.writeframes(samples.tobytes())
    return path


def test_both_layouts_are_built_in_workloads():
    assert {"speech-commands", "fsdd"} <= set(BUILTIN_WORKLOADS)


@pytest.mark.extra("speech")
@pytest.mark.real_data("speech-commands")
def test_speech_commands_gives_one_second_of_40_mel_frames_per_clip(speech_commands):
    ds = speech_commands
    assert ds.name == "speech-commands" and ds.task == "audio"
    # 16 kHz, 1 s, 10 ms hop, centred frames: 101 tokens of 40 mel bins
    assert ds.x_train.shape == (249, 101, 40) and ds.x_test.shape == (51, 101, 40)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert ds.num_classes == 30  # one class per word folder
    assert torch.isfinite(ds.x_train).all() and torch.isfinite(ds.x_test).all()
    # standardised with the training set's statistics, per mel bin
    assert abs(float(ds.x_train.mean())) < 1e-3 and abs(float(ds.x_train.std()) - 1) < 1e-3


@pytest.mark.extra("speech")
@pytest.mark.real_data("speech-commands")
def test_speech_commands_test_set_is_the_official_list_and_holds_out_whole_speakers(
    speech_commands, shared_data
):
    root = shared_data / SPEECH
    listed = set((root / "testing_list.txt").read_text().split())
    present = {f"{p.parent.name}/{p.name}" for p in root.glob("*/*.wav")}
    assert len(speech_commands.y_test) == len(listed & present) == 51
    test_speakers = {f.split("/")[1].split("_nohash_")[0] for f in listed & present}
    assert test_speakers.isdisjoint(speech_commands.group_names)
    # the lists were made by the official hash of the speaker id: the fallback agrees with them
    assert all(which_set(f) == "testing" for f in listed & present)


@pytest.mark.extra("speech")
@pytest.mark.real_data("speech-commands")
def test_every_training_clip_belongs_to_its_speakers_group(speech_commands, shared_data):
    ds = speech_commands
    assert len(ds.groups_train) == len(ds.y_train)
    assert len(ds.group_names) == len(set(ds.groups_train)) == 34
    assert all("_" not in name and len(name) == 8 for name in ds.group_names)  # speaker hashes
    counts = np.bincount(ds.groups_train)
    assert counts.sum() == 249 and counts.max() == 21  # one speaker said 21 of the words


@pytest.mark.extra("speech")
@pytest.mark.real_data("fsdd")
def test_fsdd_uses_its_official_split_inside_every_speaker(fsdd):
    ds = fsdd
    assert ds.name == "fsdd" and ds.num_classes == 10
    assert ds.x_train.shape == (2700, 101, 40) and ds.x_test.shape == (300, 101, 40)  # 8 kHz
    assert ds.group_names == ("george", "jackson", "lucas", "nicolas", "theo", "yweweler")
    # indices 0-4 of every (digit, speaker) are test: 45 train clips per digit and speaker
    for g in range(6):
        labels = ds.y_train[torch.from_numpy(ds.groups_train == g)]
        assert torch.equal(torch.bincount(labels), torch.full((10,), 45))
    assert torch.equal(torch.bincount(ds.y_test), torch.full((10,), 30))


@pytest.mark.extra("speech")
@pytest.mark.real_data("fsdd")
def test_natural_partition_gives_one_site_per_speaker(fsdd):
    rng = np.random.default_rng(0)
    parts = partition("natural", fsdd.y_train.numpy(), 6, rng, groups=fsdd.groups_train)
    assert sorted(len(set(fsdd.groups_train[p])) for p in parts) == [1] * 6
    assert sorted(len(p) for p in parts) == [450] * 6


@pytest.mark.extra("speech")
@pytest.mark.real_data("speech-commands")
def test_loading_twice_is_identical(shared_data, speech_commands):
    again = load_speech(shared_data / SPEECH, "speech-commands", seed=7)
    assert torch.equal(again.x_train, speech_commands.x_train)
    assert torch.equal(again.y_test, speech_commands.y_test)
    assert np.array_equal(again.groups_train, speech_commands.groups_train)


@pytest.mark.extra("speech")
@pytest.mark.real_data("fsdd")
def test_resampling_and_frame_settings_change_the_feature_shape(shared_data, tmp_path):
    root = small_fsdd(shared_data, tmp_path)
    ds = load_speech(root, "fsdd", sample_rate=16_000, clip_seconds=0.5, n_mels=32, hop_ms=20)
    assert ds.x_train.shape[1:] == (26, 32)  # 8000 samples, hop 320, centred frames
    assert len(ds.y_train) + len(ds.y_test) == 20


@pytest.mark.extra("speech")
def test_log_mel_puts_a_tone_in_the_right_mel_bin():
    rate = 16_000
    t = np.arange(rate, dtype=np.float32) / rate
    low, high = (np.sin(2 * np.pi * f * t)[None] for f in (300.0, 3000.0))
    bins = [int(log_mel(x.astype(np.float32), rate)[0, 50].argmax()) for x in (low, high)]
    assert bins[0] < 10 < bins[1]


def test_read_wav_scales_pcm16_to_unit_range(tmp_path):
    samples = np.array([0, 16384, -32768, 32767], dtype=np.int16)
    audio, rate = read_wav(write_wav(tmp_path / "x.wav", samples, 8000))
    assert rate == 8000
    np.testing.assert_allclose(audio, [0.0, 0.5, -1.0, 32767 / 32768])


@pytest.mark.real_data("fsdd")
def test_a_corrupt_wav_is_refused_naming_the_file(tmp_path, shared_data):
    root = small_fsdd(shared_data, tmp_path)
    bad = root / "recordings" / "3_jackson_7.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00not a wave file")
    with pytest.raises(DatasetError, match="3_jackson_7.wav"):
        load_speech(root, "fsdd")


def test_an_empty_or_24_bit_wav_is_refused_naming_the_file(tmp_path):
    empty = write_wav(tmp_path / "empty.wav", np.zeros(0, np.int16), 8000)
    with pytest.raises(DatasetError, match="empty.wav.*no audio"):
        read_wav(empty)
    deep = write_wav(tmp_path / "deep.wav", np.zeros(30, np.uint8), 8000, width=3)
    with pytest.raises(DatasetError, match="deep.wav.*24-bit"):
        read_wav(deep)


def test_files_outside_the_layout_are_refused(tmp_path):
    (tmp_path / "recordings").mkdir()
    write_wav(tmp_path / "recordings" / "hello.wav", np.zeros(80, np.int16), 8000)
    with pytest.raises(DatasetError, match="hello.wav.*<digit>_<speaker>_<index>"):
        load_speech(tmp_path, "fsdd")
    with pytest.raises(DatasetError, match="hello.wav.*<speaker>_nohash_<n>"):
        load_speech(tmp_path, "speech-commands")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no .wav clips"):
        load_speech(tmp_path / "empty", "speech-commands")
