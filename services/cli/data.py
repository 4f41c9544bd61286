"""``powertrip data``: the real data sets and traces the docs use, fetched from their public
sources (or a mirror) into a per-user cache and checked against pinned SHA-256s.

``fetch`` prints only the local paths on stdout, so ``--dataset-path "$(powertrip data fetch
mnist)"`` works; progress goes to stderr (a bar on a terminal, a line per file elsewhere).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from powertrip.fetch import (
    DATA_DIR_VARIABLE,
    DATASETS,
    DataSet,
    FetchError,
    cached_path,
    data_dir,
    entry_path,
    fetch,
    fetchable,
    get,
    missing_files,
)
from powertrip.services.cli.progress import ProgressView, Step

err = Console(stderr=True, soft_wrap=True, highlight=False)


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}")
    sys.exit(code)


def _datasets(names: Sequence[str]) -> list[DataSet]:
    try:
        return [get(n) for n in names]
    except KeyError as exc:
        _fail(str(exc.args[0]))
        raise  # unreachable: _fail exits


class _Lines:
    """Off a terminal (logs, CI): the files obtained at most every few seconds (the one
    progress renderer's rate: a data set can be thousands of files), and one line per data set."""

    def __init__(self, view: ProgressView) -> None:
        self.view, self.lock = view, threading.Lock()
        self.steps: dict[str, Step] = {}

    def begin(self, ds: DataSet, total: int) -> None:
        self.steps[ds.name] = self.view.step(ds.name, total=len(ds.files))

    def advance(self, ds: DataSet, nbytes: int) -> None:
        pass

    def fetched(self, ds: DataSet, rel: str, size: int, source: str) -> None:
        with self.lock:
            step = self.steps[ds.name]
            detail = f"{step.done + 1}/{step.total} files, fetched {ds.name}/{rel} ({_size(size)})"
            step.update(step.done + 1, detail=f"{detail} from {source}")

    def end(self, ds: DataSet, path: Path, downloaded: int) -> None:
        print(
            f"{ds.name}: {_files(len(ds.files))} verified ({downloaded} fetched now) at {path}",
            file=sys.stderr,
        )


class _Bars:
    """On a terminal: a rich bar per data set, in bytes, with speed and time left."""

    def __init__(self, console: Console) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> _Bars:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def begin(self, ds: DataSet, total: int) -> None:
        if ds.name in self.tasks:
            self.progress.update(self.tasks[ds.name], total=total or None, completed=0)
        else:
            self.tasks[ds.name] = self.progress.add_task(ds.name, total=total or None)

    def advance(self, ds: DataSet, nbytes: int) -> None:
        self.progress.advance(self.tasks[ds.name], nbytes)

    def fetched(self, ds: DataSet, rel: str, size: int, source: str) -> None:
        pass

    def end(self, ds: DataSet, path: Path, downloaded: int) -> None:
        task = self.tasks[ds.name]
        total = self.progress.tasks[task].total
        self.progress.update(task, completed=total, description=f"{ds.name} ({downloaded} new)")


_DIR = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"Cache folder [default: ${DATA_DIR_VARIABLE}, else the user's cache folder].",
)


@click.group("data")
def data() -> None:
    """Real data sets and traces: list them, fetch them (pinned SHA-256), print their paths."""


@data.command("list")
@_DIR
def list_command(directory: Path | None) -> None:
    """Each data set: what it is, its size, license, source, and whether it is cached."""
    root = data_dir(directory)
    click.echo(f"cache: {root}")
    for ds in DATASETS:
        gone = missing_files(ds, directory)
        if not gone:
            state = f"cached at {entry_path(ds, directory)}"
        elif len(gone) < len(ds.files):
            state = f"partly cached ({len(ds.files) - len(gone)} of {len(ds.files)} files)"
        else:
            state = "not cached"
        click.echo(f"\n{ds.name}  {_size(ds.size)}, {_files(len(ds.files))}  {state}")
        click.echo(f"  {ds.what}")
        click.echo(f"  license: {ds.license}")
        click.echo(f"  source: {ds.origin}")
        if ds.restricted:
            click.echo(
                f"  not fetched from the source: {ds.restricted}; download "
                f"{ds.public_url(ds.files[0])} yourself if they allow your use, or use a mirror"
            )


@data.command("fetch")
@click.argument("names", nargs=-1, metavar="NAME...")
@click.option(
    "--all", "everything", is_flag=True, help="Every data set its public source may serve."
)
@click.option(
    "--mirror",
    metavar="URL|DIR",
    default=None,
    help="Fetch from this http(s) URL or folder instead (the cache's layout: FOLDER/FILE).",
)
@_DIR
def fetch_command(
    names: tuple[str, ...], everything: bool, mirror: str | None, directory: Path | None
) -> None:
    """Fetch data sets into the cache (files already verified are kept) and print their paths.

    NAME: a data set `powertrip data list` names (mnist, fsdd, google-power, ...).

    \b
    Example:  powertrip experiment --workload mnist --dataset-path "$(powertrip data fetch mnist)"
    """
    chosen = list(dict.fromkeys([*names, *(fetchable() if everything else [])]))
    if not chosen:
        _fail("name at least one data set (`powertrip data list`), or give --all")
    _datasets(chosen)
    try:
        if err.is_terminal:
            with _Bars(err) as bars:
                paths = fetch(chosen, mirror=mirror, directory=directory, progress=bars)
        else:
            with ProgressView(err) as view:
                paths = fetch(chosen, mirror=mirror, directory=directory, progress=_Lines(view))
    except FetchError as exc:
        _fail(str(exc), code=1)
    except KeyboardInterrupt:
        _fail("interrupted: the files verified so far are kept; the same command resumes", 130)
    for path in paths:
        click.echo(str(path))


@data.command("path")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@_DIR
def path_command(names: tuple[str, ...], directory: Path | None) -> None:
    """Print where fetched data sets are (fails, saying to fetch, when one is not there)."""
    _datasets(names)
    try:
        paths = [cached_path(n, directory) for n in names]
    except FetchError as exc:
        _fail(str(exc), code=1)
    for path in paths:
        click.echo(str(path))


if __name__ == "__main__":
    data()
