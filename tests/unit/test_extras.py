"""A feature whose dependency lives in an extra says which extra installs it."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from powertrip.extras import require
from powertrip.learning.datasets import speech


def test_a_missing_module_names_the_extra_that_installs_it():
    with pytest.raises(ImportError, match=r"pip install 'powertrip\[speech\]'") as info:
        require("no_such_module_here", "speech", "the speech workloads")
    assert "the speech workloads needs no_such_module_here" in str(info.value)


def test_an_installed_module_is_returned():
    assert require("numpy", "core", "anything") is np


def test_speech_features_without_librosa_ask_for_the_speech_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "librosa", None)  # an import of it now fails
    monkeypatch.setitem(sys.modules, "librosa.filters", None)
    with pytest.raises(ImportError, match=r"powertrip\[speech\]"):
        speech.log_mel(np.zeros((1, 1600), dtype=np.float32), 16000)
