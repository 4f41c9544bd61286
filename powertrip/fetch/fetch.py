"""Obtain the pinned data sets into a per-user cache, with pooch doing the downloads and hashing.

A file is kept only when its SHA-256 matches the pinned one (pooch downloads to a temporary
file and renames it after the check), so an interrupted fetch resumes file by file: files
already in place and verified are not downloaded again, and the file that was cut off starts
over (no HTTP Range requests: the largest download is a 5.4 MB archive). A mirror (``--mirror``) has
the cache's layout, ``<folder>/<file>``, served over HTTP or as a local folder.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

from powertrip.fetch.download import (
    FetchError,
    Progress,
    Quiet,
    download,
    from_archive,
    pooch_quiet,
    verified,
)
from powertrip.fetch.sources import DATASETS, DataFile, DataSet, get

#: overrides the cache folder (``--dir`` overrides it in turn)
DATA_DIR_VARIABLE = "POWERTRIP_DATA_DIR"
#: at most this many files download at once (FSDD is 3,000 small files)
WORKERS = 8


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


def _is_url(mirror: str) -> bool:
    return re.match(r"^(https?|ftp)://", mirror) is not None


def _mirror_source(mirror: str, ds: DataSet, f: DataFile) -> str:
    rel = f"{ds.folder}/{f.rel}"
    if _is_url(mirror):
        return mirror.rstrip("/") + "/" + quote(rel)
    return str(Path(mirror.removeprefix("file://")).expanduser() / rel)


def _restricted(ds: DataSet, todo: Sequence[DataFile], folder: Path) -> FetchError:
    f = todo[0]
    return FetchError(
        f"{ds.name} is not fetched from its public source: {ds.restricted}. If they allow your "
        f"use, download {ds.public_url(f)} and save it as {folder / f.rel} (then `powertrip data "
        f"fetch {ds.name}` checks it), or fetch it from a mirror you keep (--mirror)"
    )


def _fetch_one(
    ds: DataSet, root: Path, mirror: str | None, progress: Progress, workers: int
) -> Path:
    folder = root / ds.folder
    progress.begin(ds, ds.size)
    lock = threading.Lock()
    todo: list[DataFile] = []

    def check(f: DataFile) -> None:
        path = folder / f.rel
        if verified(path, f):
            progress.advance(ds, path.stat().st_size)
        else:
            with lock:
                todo.append(f)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(check, ds.files))
    todo.sort(key=lambda f: f.rel)
    if todo and mirror is None and ds.restricted:
        folder.mkdir(parents=True, exist_ok=True)  # where the user is told to put it
        raise _restricted(ds, todo, folder)
    if todo and mirror is None and ds.archive_url:
        from_archive(ds, todo, folder, root, progress)
    elif todo:
        for parent in {(folder / f.rel).parent for f in todo}:
            parent.mkdir(parents=True, exist_ok=True)  # before the threads: pooch's mkdir races
        local = mirror is not None and not _is_url(mirror)
        if local and not Path(str(mirror).removeprefix("file://")).expanduser().is_dir():
            raise FetchError(f"{ds.name}: the mirror {mirror} is not a folder or an http(s) URL")

        def obtain(f: DataFile) -> None:
            source = ds.public_url(f) if mirror is None else _mirror_source(mirror, ds, f)
            download(ds, f, folder / f.rel, source, local, progress)

        with ThreadPoolExecutor(workers) as pool:
            futures = [pool.submit(obtain, f) for f in todo]
            try:
                for future in futures:
                    future.result()
            except BaseException:  # a failure or Ctrl-C: start no more (verified files stay)
                pool.shutdown(cancel_futures=True)
                raise
    path = entry_path(ds, root)
    progress.end(ds, path, len(todo))
    return path


def fetch(
    names: Sequence[str | DataSet],
    *,
    mirror: str | None = None,
    directory: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    workers: int = WORKERS,
) -> list[Path]:
    """Fetch each data set (a name, or a DataSet of one's own) into the cache and verify every
    file; return their paths.

    ``mirror``: an http(s) URL or a folder with the cache's layout, used instead of the public
    sources. Raises FetchError (one line) on the first data set that cannot be completed.
    """
    sets = [n if isinstance(n, DataSet) else get(n) for n in names]
    root = data_dir(directory)
    with pooch_quiet():
        return [_fetch_one(ds, root, mirror, progress or Quiet(), workers) for ds in sets]


def fetchable() -> list[str]:
    """The data sets ``fetch`` takes from their public sources (the rest need a mirror)."""
    return [d.name for d in DATASETS if not d.restricted]
