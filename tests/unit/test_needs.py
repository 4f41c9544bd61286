"""A base install passes its own tests: a test marked with what it needs beyond the base (an extra,
a real data set) skips where that is missing, naming the one command that brings it, and runs
where it is found, in the project's test data or in the cache ``powertrip data fetch`` fills."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from powertrip.fetch import DATASETS, get
from tests.needs import (
    EXTRAS,
    data_view,
    find_real_data,
    real_data_path,
    shared_data_dir,
)

REPO = Path(__file__).resolve().parents[2]
FOUND = {ds.name: find_real_data(ds.name) for ds in DATASETS}  # before a test hides them


def copy_data_set(name: str, root: Path) -> None:
    """Data set ``name`` from where the test run found it into ``root``, in the same layout."""
    ds, found = get(name), FOUND[name]
    assert found is not None, f"{name} not found: mark the test real_data({name!r})"
    for f in ds.files:
        dest = root / ds.folder / f.rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(found / ds.folder / f.rel, dest)


@pytest.fixture()
def nowhere(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """An empty test data folder and an empty fetch cache: no real data anywhere."""
    shared, cache = tmp_path / "shared", tmp_path / "cache"
    shared.mkdir()
    cache.mkdir()
    monkeypatch.setenv("POWERTRIP_SHARED_DATA", str(shared))
    monkeypatch.setenv("POWERTRIP_DATA_DIR", str(cache))
    return shared, cache


def test_every_extra_of_pyproject_is_known_with_the_modules_it_brings():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert set(EXTRAS) == set(extras["optional-dependencies"]) - {"dev"}


def test_every_data_set_is_found_in_the_projects_test_data():
    """So CI, which has that folder, skips no test for its data."""
    shared = shared_data_dir()
    if not shared.is_dir():
        pytest.skip(f"checks the project's test data folder, not here: {shared}")
    assert {ds.name: find_real_data(ds.name) for ds in DATASETS} == {
        ds.name: shared for ds in DATASETS
    }


@pytest.mark.real_data("tinyshakespeare")
def test_a_fetched_data_set_is_found_in_the_cache_and_the_rest_are_not(nowhere):
    _, cache = nowhere
    copy_data_set("tinyshakespeare", cache)
    assert find_real_data("tinyshakespeare") == cache
    assert real_data_path("tinyshakespeare") == cache / "datasets/tinyshakespeare/input.txt"
    assert find_real_data("mnist") is None
    assert real_data_path("mnist") == shared_data_dir() / "datasets/mnist_t10k"


@pytest.mark.real_data("mnist", "google-power", "watttime-caiso-north", "curtail-llm-mci")
def test_data_sets_split_between_test_data_and_cache_are_seen_as_one_folder(nowhere, tmp_path):
    shared, cache = nowhere
    copy_data_set("mnist", shared)
    copy_data_set("curtail-llm-mci", shared)
    copy_data_set("google-power", cache)
    copy_data_set("watttime-caiso-north", cache)  # the same carbon/ folder as curtail-llm-mci
    view = data_view([ds.name for ds in DATASETS], tmp_path / "view")
    for name in ("mnist", "google-power", "watttime-caiso-north", "curtail-llm-mci"):
        ds = get(name)
        assert all((view / ds.folder / f.rel).is_file() for f in ds.files), name
    assert not (view / "datasets/fsdd").exists()


CALLER = """
import pytest

@pytest.mark.extra("speech")
def test_speech():
    pass

@pytest.mark.real_data("mnist")
def test_mnist(shared_data):
    assert (shared_data / "datasets/mnist_t10k/t10k-labels-idx1-ubyte.gz").is_file()

@pytest.mark.real_data("curtail-llm-mci")
def test_mci():
    pass

def test_plain():
    pass
"""


def run_marked_tests(pytester: pytest.Pytester, monkeypatch) -> pytest.RunResult:
    """The tests above under this repository's conftest, in process; speech's soxr missing."""
    monkeypatch.setitem(EXTRAS, "speech", ("no_such_module_soxr_here",))
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n")
    pytester.makepyfile(test_marked=CALLER)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rs")


@pytest.mark.real_data("mnist")
def test_a_test_whose_extra_or_data_is_missing_skips_naming_what_brings_it(
    pytester, monkeypatch, nowhere
):
    result = run_marked_tests(pytester, monkeypatch)
    result.assert_outcomes(passed=1, skipped=3)
    out = result.stdout.str()
    assert (
        "needs the speech extra (no_such_module_soxr_here is not installed): "
        "pip install 'powertrip[speech]'" in out
    )
    assert "needs the real mnist data, not found: powertrip data fetch mnist" in out
    assert (
        "needs the real curtail-llm-mci data, not found: "
        "powertrip data fetch curtail-llm-mci --mirror URL|DIR" in out
    )


@pytest.mark.real_data("mnist", "curtail-llm-mci")
def test_a_fetched_data_set_lets_its_tests_run(pytester, monkeypatch, nowhere):
    shared, cache = nowhere
    copy_data_set("mnist", cache)
    copy_data_set("curtail-llm-mci", shared)
    result = run_marked_tests(pytester, monkeypatch)
    result.assert_outcomes(passed=3, skipped=1)


def test_an_unknown_name_in_a_marker_is_refused_naming_the_test(pytester):
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n")
    pytester.makepyfile(
        test_typo='import pytest\n\n@pytest.mark.real_data("mnsit")\ndef test_x():\n    pass\n'
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.stderr.fnmatch_lines(["*test_typo.py::test_x: unknown real_data 'mnsit' (*mnist*"])
