"""Getting one file, or the files of one archive, into the cache: pooch downloads (or copies,
from a folder mirror) into a temporary file and keeps it only when its SHA-256 matches; every
failure becomes one line naming the data set, the file and where it came from."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from powertrip.fetch.sources import DataFile, DataSet

ARCHIVES = ".archives"  # downloaded archives, removed once their files are in place


class FetchError(RuntimeError):
    """A data set could not be obtained: the message is one line naming the set, file and URL."""


class Progress(Protocol):
    """What a fetch reports, so the command line can draw it (the library prints nothing)."""

    def begin(self, ds: DataSet, total: int) -> None:
        """Work on ``ds`` starts (again, with a new total) and amounts to ``total`` bytes."""

    def advance(self, ds: DataSet, nbytes: int) -> None:
        """``nbytes`` more of ``ds`` are in place (negative: a download started over)."""

    def fetched(self, ds: DataSet, rel: str, size: int, source: str) -> None:
        """One file was downloaded or copied from ``source`` and verified."""

    def end(self, ds: DataSet, path: Path, downloaded: int) -> None:
        """Every file of ``ds`` is in place and verified; ``downloaded`` of them were new."""


class Quiet:
    """Reports nothing: the library's default."""

    def begin(self, ds: DataSet, total: int) -> None:
        pass

    def advance(self, ds: DataSet, nbytes: int) -> None:
        pass

    def fetched(self, ds: DataSet, rel: str, size: int, source: str) -> None:
        pass

    def end(self, ds: DataSet, path: Path, downloaded: int) -> None:
        pass


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verified(path: Path, f: DataFile) -> bool:
    return path.is_file() and sha256(path) == f.sha256


@contextlib.contextmanager
def pooch_quiet() -> Iterator[None]:
    """pooch logs every download at INFO to stderr; the fetch reports through ``Progress``."""
    import pooch

    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


class Bar:
    """pooch's progress-bar interface (``total``, ``update``, ``reset``, ``close``), forwarded to
    a data set's byte count."""

    def __init__(self, progress: Progress, ds: DataSet, on_total: Callable[[int], None] | None):
        self.progress, self.ds, self.on_total, self.done = progress, ds, on_total, 0
        self._total = 0

    @property
    def total(self) -> int:
        return self._total

    @total.setter
    def total(self, value: int) -> None:
        self._total = value
        if self.on_total is not None:
            self.on_total(value)

    def update(self, n: int) -> None:
        self.done += n
        self.progress.advance(self.ds, n)

    def reset(self) -> None:
        self.progress.advance(self.ds, -self.done)
        self.done = 0

    def close(self) -> None:
        pass


def copier(bar: Bar) -> Callable[[str, Any, Any], None]:
    """A pooch downloader that copies from a local folder (a ``--mirror DIR``)."""

    def copy(url: str, output_file: Any, pooch: Any) -> None:
        with open(url, "rb") as src, open(output_file, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                dst.write(block)
                bar.update(len(block))

    return copy


def http(bar: Bar) -> Any:
    import pooch

    return pooch.HTTPDownloader(progressbar=bar, chunk_size=1 << 16)


def _hash_message(exc: ValueError) -> str | None:
    m = re.search(r"expected (\S+) but got (\S+?)\.?(\s|$)", str(exc))
    if m is None:
        return None
    expected = m.group(1).removeprefix("sha256:")
    return f"its SHA-256 {m.group(2)} is not the pinned {expected}; the file was not kept"


def explain(exc: BaseException, ds: DataSet, what: str, source: str) -> FetchError:
    """One line naming the data set, the file and where it came from, and what went wrong."""
    import requests

    head = f"{ds.name}: {what} from {source}"
    if isinstance(exc, ValueError) and (reason := _hash_message(exc)):
        return FetchError(f"{head}: {reason}")
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return FetchError(f"{head}: the server answered HTTP {exc.response.status_code}")
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return FetchError(f"{head}: cannot reach the server (no network, or the host is down)")
    if isinstance(exc, FileNotFoundError):
        return FetchError(f"{head}: no such file in the mirror")
    return FetchError(f"{head}: {type(exc).__name__}: {exc}")


def download(
    ds: DataSet, f: DataFile, dest: Path, source: str, local: bool, progress: Progress
) -> None:
    """One file from a URL or a local path into ``dest``, kept only if its hash matches."""
    import pooch

    bar = Bar(progress, ds, None)
    downloader = copier(bar) if local else http(bar)
    try:
        pooch.retrieve(
            source,
            known_hash=f"sha256:{f.sha256}",
            fname=dest.name,
            path=dest.parent,
            downloader=downloader,
        )
    except Exception as exc:
        bar.reset()
        raise explain(exc, ds, f.rel, source) from exc
    progress.fetched(ds, f.rel, dest.stat().st_size, source)


def member_path(extracted: Path, files: Sequence[str], want: str) -> Path | None:
    for name in files:
        rel = Path(name).relative_to(extracted).as_posix()
        if rel == want or rel.endswith("/" + want):
            return Path(name)
    return None


def from_archive(
    ds: DataSet, todo: Sequence[DataFile], folder: Path, root: Path, progress: Progress
) -> None:
    """Download ``ds``'s archive once, then take each missing file out of it by its hash."""
    import pooch

    store = root / ARCHIVES / ds.name
    name = ds.archive_url.rsplit("/", 1)[-1]
    processor = pooch.Unzip() if name.endswith(".zip") else pooch.Untar()
    bar = Bar(progress, ds, lambda total: progress.begin(ds, total))
    try:
        archive = pooch.retrieve(
            ds.archive_url,
            known_hash=f"sha256:{ds.archive_sha256}" if ds.archive_sha256 else None,
            fname=name,
            path=store,
            downloader=http(bar),
        )
        members = processor(archive, "download", None)
    except Exception as exc:
        raise explain(exc, ds, name, ds.archive_url) from exc
    extracted = store / (name + (".unzip" if name.endswith(".zip") else ".untar"))
    for f in todo:
        found = member_path(extracted, members, ds.member(f))
        if found is None or sha256(found) != f.sha256:
            shutil.rmtree(store, ignore_errors=True)  # a bad archive is not reused
            reason = "is not in it" if found is None else "does not match its pinned SHA-256"
            raise FetchError(f"{ds.name}: {ds.member(f)} in {ds.archive_url} {reason}")
        dest = folder / f.rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        shutil.copyfile(found, tmp)
        os.replace(tmp, dest)
        progress.fetched(ds, f.rel, dest.stat().st_size, f"{name}:{found.relative_to(extracted)}")
    shutil.rmtree(store, ignore_errors=True)
    with contextlib.suppress(OSError):
        store.parent.rmdir()  # only when no other archive is half done
