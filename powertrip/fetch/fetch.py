"""Obtain the pinned data sets into a per-user cache, with pooch doing the downloads and hashing.

A file is kept only when its SHA-256 matches the pinned one (pooch downloads to a temporary
file and renames it after the check), so an interrupted fetch resumes file by file: files
already in place and verified are not downloaded again, and the file that was cut off starts
over (no HTTP Range requests: the largest single file is 1.6 MB). A mirror (``--mirror``) has
the cache's layout, ``<folder>/<file>``, served over HTTP or as a local folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from powertrip.fetch.sources import DATASETS, DataFile, DataSet, get

#: overrides the cache folder (``--dir`` overrides it in turn)
DATA_DIR_VARIABLE = "POWERTRIP_DATA_DIR"
#: at most this many files download at once (FSDD is 3,000 small files)
WORKERS = 8
_ARCHIVES = ".archives"  # downloaded archives, removed once their files are in place


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


class _Quiet:
    def begin(self, ds: DataSet, total: int) -> None:
        pass

    def advance(self, ds: DataSet, nbytes: int) -> None:
        pass

    def fetched(self, ds: DataSet, rel: str, size: int, source: str) -> None:
        pass

    def end(self, ds: DataSet, path: Path, downloaded: int) -> None:
        pass


def data_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    """The cache folder: ``directory``, else ``$POWERTRIP_DATA_DIR``, else the user's cache."""
    if directory:
        return Path(directory).expanduser()
    if os.environ.get(DATA_DIR_VARIABLE):
        return Path(os.environ[DATA_DIR_VARIABLE]).expanduser()
    import pooch  # lazily: requests is not needed to name a folder

    return Path(pooch.os_cache("powertrip")) / "data"


def entry_path(ds: DataSet, directory: str | os.PathLike[str] | None = None) -> Path:
    """Where ``ds`` is (or will be) in the cache: the path the commands take."""
    folder = data_dir(directory) / ds.folder
    return folder / ds.entry if ds.entry else folder


def missing_files(ds: DataSet, directory: str | os.PathLike[str] | None = None) -> list[DataFile]:
    """The files of ``ds`` not in the cache (present files are not hashed: ``fetch`` does that)."""
    folder = data_dir(directory) / ds.folder
    return [f for f in ds.files if not (folder / f.rel).is_file()]


def cached_path(name: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """The cached path of data set ``name``; FetchError when it is not (all) there."""
    ds = get(name)
    gone = missing_files(ds, directory)
    if gone:
        where = data_dir(directory) / ds.folder
        raise FetchError(
            f"{name}: not fetched ({len(gone)} of {len(ds.files)} files missing in {where}); "
            f"run `powertrip data fetch {name}`"
        )
    return entry_path(ds, directory)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verified(path: Path, f: DataFile) -> bool:
    return path.is_file() and _sha256(path) == f.sha256


@contextlib.contextmanager
def _pooch_quiet() -> Iterator[None]:
    """pooch logs every download at INFO to stderr; the fetch reports through ``Progress``."""
    import pooch

    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


class _Bar:
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


def _copier(bar: _Bar) -> Callable[[str, Any, Any], None]:
    """A pooch downloader that copies from a local folder (a ``--mirror DIR``)."""

    def copy(url: str, output_file: Any, pooch: Any) -> None:
        with open(url, "rb") as src, open(output_file, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                dst.write(block)
                bar.update(len(block))

    return copy


def _http(bar: _Bar) -> Any:
    import pooch

    return pooch.HTTPDownloader(progressbar=bar, chunk_size=1 << 16)


def _is_url(mirror: str) -> bool:
    return re.match(r"^(https?|ftp)://", mirror) is not None


def _mirror_source(mirror: str, ds: DataSet, f: DataFile) -> str:
    rel = f"{ds.folder}/{f.rel}"
    if _is_url(mirror):
        return mirror.rstrip("/") + "/" + quote(rel)
    return str(Path(mirror.removeprefix("file://")).expanduser() / rel)


def _hash_message(exc: ValueError) -> str | None:
    m = re.search(r"expected (\S+) but got (\S+?)\.?(\s|$)", str(exc))
    if m is None:
        return None
    return f"its SHA-256 {m.group(2)} is not the pinned {m.group(1)}; the file was not kept"


def _explain(exc: BaseException, ds: DataSet, what: str, source: str) -> FetchError:
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


def _download(
    ds: DataSet, f: DataFile, dest: Path, source: str, local: bool, progress: Progress
) -> None:
    """One file from a URL or a local path into ``dest``, kept only if its hash matches."""
    import pooch

    bar = _Bar(progress, ds, None)
    downloader = _copier(bar) if local else _http(bar)
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
        raise _explain(exc, ds, f.rel, source) from exc
    progress.fetched(ds, f.rel, dest.stat().st_size, source)


def _restricted(ds: DataSet, todo: Sequence[DataFile], folder: Path) -> FetchError:
    f = todo[0]
    return FetchError(
        f"{ds.name} is not fetched from its public source: {ds.restricted}. If they allow your "
        f"use, download {ds.public_url(f)} and save it as {folder / f.rel} (then `powertrip data "
        f"fetch {ds.name}` checks it), or fetch it from a mirror you keep (--mirror)"
    )


def _member(extracted: Path, files: Sequence[str], want: str) -> Path | None:
    for name in files:
        rel = Path(name).relative_to(extracted).as_posix()
        if rel == want or rel.endswith("/" + want):
            return Path(name)
    return None


def _from_archive(
    ds: DataSet, todo: Sequence[DataFile], folder: Path, root: Path, progress: Progress
) -> None:
    """Download ``ds``'s archive once, then take each missing file out of it by its hash."""
    import pooch

    store = root / _ARCHIVES / ds.name
    name = ds.archive_url.rsplit("/", 1)[-1]
    processor = pooch.Unzip() if name.endswith(".zip") else pooch.Untar()
    bar = _Bar(progress, ds, lambda total: progress.begin(ds, total))
    try:
        archive = pooch.retrieve(
            ds.archive_url,
            known_hash=f"sha256:{ds.archive_sha256}" if ds.archive_sha256 else None,
            fname=name,
            path=store,
            downloader=_http(bar),
        )
        members = processor(archive, "download", None)
    except Exception as exc:
        raise _explain(exc, ds, name, ds.archive_url) from exc
    extracted = store / (name + (".unzip" if name.endswith(".zip") else ".untar"))
    for f in todo:
        found = _member(extracted, members, ds.member(f))
        if found is None or _sha256(found) != f.sha256:
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


def _fetch_one(
    ds: DataSet, root: Path, mirror: str | None, progress: Progress, workers: int
) -> Path:
    folder = root / ds.folder
    progress.begin(ds, ds.size)
    lock = threading.Lock()
    todo: list[DataFile] = []

    def check(f: DataFile) -> None:
        path = folder / f.rel
        if _verified(path, f):
            progress.advance(ds, path.stat().st_size)
        else:
            with lock:
                todo.append(f)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(check, ds.files))
    todo.sort(key=lambda f: f.rel)
    if todo and mirror is None and ds.restricted:
        raise _restricted(ds, todo, folder)
    if todo and mirror is None and ds.archive_url:
        _from_archive(ds, todo, folder, root, progress)
    elif todo:
        for parent in {(folder / f.rel).parent for f in todo}:
            parent.mkdir(parents=True, exist_ok=True)  # before the threads: pooch's mkdir races
        local = mirror is not None and not _is_url(mirror)
        if local and not Path(str(mirror).removeprefix("file://")).expanduser().is_dir():
            raise FetchError(f"{ds.name}: the mirror {mirror} is not a folder or an http(s) URL")

        def obtain(f: DataFile) -> None:
            source = ds.public_url(f) if mirror is None else _mirror_source(mirror, ds, f)
            _download(ds, f, folder / f.rel, source, local, progress)

        with ThreadPoolExecutor(workers) as pool:
            futures = [pool.submit(obtain, f) for f in todo]
            for future in futures:
                try:
                    future.result()
                except FetchError:
                    pool.shutdown(cancel_futures=True)
                    raise
    path = entry_path(ds, root)
    progress.end(ds, path, len(todo))
    return path


def fetch(
    names: Sequence[str],
    *,
    mirror: str | None = None,
    directory: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    workers: int = WORKERS,
) -> list[Path]:
    """Fetch each named data set into the cache and verify every file; return their paths.

    ``mirror``: an http(s) URL or a folder with the cache's layout, used instead of the public
    sources. Raises FetchError (one line) on the first data set that cannot be completed.
    """
    sets = [get(n) for n in names]
    root = data_dir(directory)
    with _pooch_quiet():
        return [_fetch_one(ds, root, mirror, progress or _Quiet(), workers) for ds in sets]


def fetchable() -> list[str]:
    """The data sets ``fetch`` takes from their public sources (the rest need a mirror)."""
    return [d.name for d in DATASETS if not d.restricted]
